//! The event log's record of one upload, as the server writes it
//! (`message received`, with its database, device, message and request
//! id), for the benches that fill a log.

use estafeta_server::events::EventRecord;

/// Upload `i`'s record, made at `nanos` since the epoch, with `request`
/// for its request id: of 2 databases and 16 devices in turn, its message
/// id a ULID (time-ordered, as a device makes them).
pub(crate) fn upload_record(i: u64, nanos: u64, request: uuid::Uuid) -> EventRecord {
    let ts = chrono::DateTime::from_timestamp_nanos(i64::try_from(nanos).unwrap_or(i64::MAX));
    EventRecord {
        id: format!("{nanos}-{i}"),
        ts: ts.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        level: "INFO".to_owned(),
        target: "estafeta::event".to_owned(),
        text: "message received".to_owned(),
        db: Some(format!("db-{}", i % 2)),
        device: Some(format!("phone-{}", i % 16)),
        process: None,
        message: Some(format!("01K{:013X}{:010X}", nanos / 1_000_000, i)),
        request: Some(request.to_string()),
        fields: serde_json::Map::new(),
    }
}
