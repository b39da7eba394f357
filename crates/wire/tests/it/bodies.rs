//! The wire types as a whole: their OpenAPI schemas are complete, and
//! full bodies round-trip through JSON (as the client crate relies on).

use std::collections::BTreeSet;

use estafeta_wire::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use utoipa::ToSchema;
use utoipa::openapi::schema::{Components, ComponentsBuilder};

fn id(s: &str) -> Id {
    Id::new(s).unwrap()
}

/// A message with the given routing, created at `created_ms` and arrived at
/// `arrived_ms` (the time inside its id); `seq` keeps ids unique.
fn message(
    from: &str,
    to: &str,
    subsystem: &str,
    created_ms: i64,
    arrived_ms: u64,
    seq: u128,
    body: &str,
) -> Message {
    Message {
        version: Version,
        id: MessageId::from_parts(arrived_ms, seq),
        from: id(from),
        to: id(to),
        subsystem: id(subsystem),
        created_at: Timestamp::from_millis(created_ms),
        body: Body::from_json(body).unwrap(),
    }
}

/// Adds `T` and everything it refers to.
fn with<T: ToSchema>(builder: ComponentsBuilder) -> ComponentsBuilder {
    let mut nested = Vec::new();
    T::schemas(&mut nested);
    builder.schema_from::<T>().schemas_from_iter(nested)
}

fn all_components() -> Components {
    let b = ComponentsBuilder::new();
    let b = with::<CreateEnterprise>(b);
    let b = with::<CreateSubsystem>(b);
    let b = with::<CreateDatabase>(b);
    let b = with::<CreateDevice>(b);
    let b = with::<Credentials>(b);
    let b = with::<ProcessList>(b);
    let b = with::<Stats>(b);
    let b = with::<FolderListing>(b);
    let b = with::<SendMessage>(b);
    let b = with::<MessageAccepted>(b);
    let b = with::<Inbox>(b);
    let b = with::<AckRequest>(b);
    let b = with::<AckResponse>(b);
    let b = with::<StartRequest>(b);
    let b = with::<StartResponse>(b);
    let b = with::<AcceptRequest>(b);
    let b = with::<PrepareRequest>(b);
    let b = with::<CommitRequest>(b);
    let b = with::<RollbackRequest>(b);
    let b = with::<AbortRequest>(b);
    let b = with::<CallResponse>(b);
    let b = with::<ProcessStatus>(b);
    let b = with::<ErrorBody>(b);
    b.build()
}

/// Every `$ref` string anywhere in a JSON document.
fn refs(v: &serde_json::Value, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("$ref", serde_json::Value::String(s)) => {
                        out.insert(s.clone());
                    }
                    _ => refs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

#[test]
fn every_schema_reference_resolves() {
    let doc = serde_json::to_value(all_components()).unwrap();
    let names: BTreeSet<String> = doc["schemas"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let mut found = BTreeSet::new();
    refs(&doc, &mut found);
    assert!(!found.is_empty());
    for r in found {
        let name = r.strip_prefix("#/components/schemas/").unwrap();
        assert!(names.contains(name), "unresolved {r}");
    }
    for expected in [
        "Version",
        "Id",
        "Message",
        "ProcessState",
        "ResultStatus",
        "Folder",
        "Body",
    ] {
        assert!(names.contains(expected), "missing {expected}");
    }
    // The status enums list the exact words.
    let states = doc["schemas"]["ProcessState"]["enum"].as_array().unwrap();
    assert!(states.contains(&"READY_TO_COMMIT".into()));
    assert_eq!(doc["schemas"]["Version"]["enum"], serde_json::json!([1]));
}

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: T) {
    let text = serde_json::to_string(&value).unwrap();
    assert!(
        text.starts_with(r#"{"version":1"#) || !text.contains("\"version\""),
        "{text}"
    );
    let back: T = serde_json::from_str(&text).unwrap();
    assert_eq!(back, value, "{text}");
}

#[test]
fn full_bodies_round_trip() {
    let t = Timestamp::from_millis(1_764_064_800_123);
    let mid = MessageId::from_parts(5, 5);
    let pid = ProcessId::from_parts(6, 6);
    let m = message("phone-1", "db-a", "sales", 1, 2, 3, r#"{"k":[1,"2",null]}"#);
    round_trip(Inbox {
        version: Version,
        messages: vec![m.clone(), m.clone()],
    });
    round_trip(StartResponse {
        version: Version,
        status: StartStatus::Ok,
        process_id: Some(pid),
        messages: Some(vec![m.clone()]),
    });
    round_trip(StartRequest {
        version: Version,
        db_id: id("db-a"),
        subsystems: Some(vec![id("sales")]),
        senders: Some(vec![id("phone-1")]),
        max_files: Some(5),
        max_mb: Some(1.5),
    });
    round_trip(SendMessage {
        version: Version,
        to: id("db-a"),
        body: Body::from_json("[]").unwrap(),
        created_at: Some(t),
        deliver_at: None,
        idempotency_key: Some("k-1".to_owned()),
    });
    round_trip(PrepareRequest {
        version: Version,
        results: vec![MessageResult {
            message_id: mid,
            status: ResultStatus::ProcessedDeadlock,
            error_code: None,
            error_text: Some("deadlock".to_owned()),
        }],
        replies: vec![Reply {
            to: id("phone-1"),
            body: Body::from_json(r#"{"ok":1}"#).unwrap(),
            created_at: Some(t),
            deliver_at: None,
        }],
    });
    round_trip(AcceptRequest {
        version: Version,
        message_ids: vec![mid],
    });
    round_trip(AckRequest {
        version: Version,
        ids: vec![mid],
    });
    round_trip(AckResponse {
        version: Version,
        acked: 1,
    });
    round_trip(MessageAccepted {
        version: Version,
        id: mid,
    });
    round_trip(RollbackRequest {
        version: Version,
        error_text: "commit failed".to_owned(),
    });
    round_trip(AbortRequest {
        version: Version,
        message: "bye".to_owned(),
    });
    round_trip(ProcessStatus {
        version: Version,
        process_id: pid,
        db_id: id("db-a"),
        state: ProcessState::InDoubt,
    });
    round_trip(ProcessList {
        version: Version,
        processes: vec![ProcessSummary {
            process_id: pid,
            db_id: id("db-a"),
            state: ProcessState::Started,
            started_at: t,
            ready_at: None,
            ended_at: Some(t),
            messages: 3,
            replies: 1,
        }],
    });
    round_trip(Stats {
        version: Version,
        databases: vec![DatabaseStats {
            id: id("db-a"),
            enterprise: id("acme"),
            received: 1,
            waiting: 2,
            processes: 3,
            processed: 4,
            deadlocks: 5,
            incorrect: 6,
            replies: 7,
            not_committed: 8,
            in_doubt: 9,
            last_error: Some("7: bad total".into()),
            last_seen: Some(Timestamp::from_millis(1_800_000_000_000)),
        }],
        devices: vec![DeviceStats {
            id: id("phone-1"),
            enterprise: id("acme"),
            subsystem: id("sales"),
            sent: 1,
            duplicates: 2,
            received: 3,
            acked: 4,
            processed: 5,
            deadlocks: 6,
            incorrect: 7,
        }],
    });
    round_trip(FolderListing {
        version: Version,
        db_id: id("db-a"),
        folder: Folder::Unknown,
        files: vec![FileInfo {
            name: "n".to_owned(),
            size: 10,
            id: mid,
            from: id("a"),
            to: id("b"),
            subsystem: id("c"),
            created_at: t,
            error_code: Some(7),
            error_text: Some("bad order".to_owned()),
        }],
    });
    round_trip(Credentials {
        version: Version,
        id: id("db-a"),
        token: "t".to_owned(),
    });
    round_trip(ErrorBody::new(ErrorCode::BadRequest, "version must be 1"));
}

#[test]
fn wrong_or_missing_versions_are_refused_everywhere() {
    let bodies = [
        r#"{"id":"acme"}"#,
        r#"{"version":2,"id":"acme"}"#,
        r#"{"version":"1","id":"acme"}"#,
    ];
    for b in bodies {
        assert!(serde_json::from_str::<CreateEnterprise>(b).is_err(), "{b}");
    }
    assert!(serde_json::from_str::<CommitRequest>(r#"{"version":0}"#).is_err());
    assert!(serde_json::from_str::<AckRequest>(r#"{"ids":[]}"#).is_err());
    // Unknown fields are ignored.
    let e: CreateEnterprise =
        serde_json::from_str(r#"{"version":1,"id":"acme","colour":"red"}"#).unwrap();
    assert_eq!(e.id, id("acme"));
}

#[test]
fn an_ack_ignores_elements_that_are_not_message_ids() {
    let ids = UlidGenerator::new();
    let real = ids.message_id(std::time::SystemTime::now());
    let body = format!(
        r#"{{"version":1,"ids":["not-an-id",5,{{"x":1}},null,"{real}","01ZZZZZZZZZZZZZZZZZZZZZZZZ9"]}}"#
    );
    let req: AckRequest = serde_json::from_str(&body).unwrap();
    assert_eq!(req.ids, vec![real]);
    assert!(serde_json::from_str::<AckRequest>(r#"{"version":1,"ids":"x"}"#).is_err());
}
