//! [`Timestamp`]: a UTC instant with millisecond precision, the `created_at`
//! of messages.
//!
//! It is kept within years 0000–9999 so that it always has the fixed-width
//! form `YYYYMMDDTHHMMSSmmmZ` used at the start of message file names (which
//! then sort chronologically as plain strings). Sender-given times outside
//! that range are clamped rather than rejected: the message is still worth
//! delivering.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Datelike, NaiveDate, Timelike, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::error::TimestampError;

/// Milliseconds since the Unix epoch, within `0000-01-01T00:00:00.000Z ..=
/// 9999-12-31T23:59:59.999Z`. Serialized as RFC 3339 with milliseconds and
/// `Z`, e.g. `"2026-11-25T10:00:00.123Z"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The earliest representable instant, 0000-01-01T00:00:00.000Z.
    pub const MIN: Timestamp = Timestamp(-62_167_219_200_000);
    /// The latest representable instant, 9999-12-31T23:59:59.999Z.
    pub const MAX: Timestamp = Timestamp(253_402_300_799_999);

    /// The instant `ms` milliseconds after the Unix epoch, clamped to the range.
    pub fn from_millis(ms: i64) -> Self {
        Self(ms.clamp(Self::MIN.0, Self::MAX.0))
    }

    /// The instant of a [`SystemTime`] (from the caller's clock), clamped.
    pub fn from_system_time(t: SystemTime) -> Self {
        let ms = match t.duration_since(UNIX_EPOCH) {
            Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
            Err(before) => i64::try_from(before.duration().as_millis())
                .map(|ms| -ms)
                .unwrap_or(i64::MIN),
        };
        Self::from_millis(ms)
    }

    /// The same instant as a [`SystemTime`].
    pub fn to_system_time(self) -> SystemTime {
        let abs = Duration::from_millis(self.0.unsigned_abs());
        if self.0 >= 0 {
            UNIX_EPOCH + abs
        } else {
            UNIX_EPOCH - abs
        }
    }

    /// Milliseconds since the Unix epoch.
    pub fn as_millis(self) -> i64 {
        self.0
    }

    /// Parses RFC 3339 (any offset, any fraction; truncated to milliseconds,
    /// clamped to the range).
    pub fn parse_rfc3339(s: &str) -> Result<Self, TimestampError> {
        DateTime::parse_from_rfc3339(s)
            .map(|t| Self::from_millis(t.timestamp_millis()))
            .map_err(|_| TimestampError(s.to_owned()))
    }

    /// The fixed-width form `YYYYMMDDTHHMMSSmmmZ` (19 ASCII characters) used in
    /// file names; it sorts chronologically as a string.
    pub fn to_compact(self) -> String {
        let mut out = String::with_capacity(19);
        // Writing into a String cannot fail.
        let _ = self.write_compact(&mut out);
        out
    }

    /// Writes [`to_compact`](Self::to_compact)'s form into `out` without
    /// a `String` of its own: file names are printed for every path,
    /// listing and saved record that holds them.
    pub fn write_compact(self, out: &mut impl std::fmt::Write) -> std::fmt::Result {
        out.write_str(self.render(&COMPACT).as_str())
    }

    /// Parses the form made by [`to_compact`](Self::to_compact).
    pub fn parse_compact(s: &str) -> Result<Self, TimestampError> {
        let bad = || TimestampError(s.to_owned());
        let b = s.as_bytes();
        let shape_ok = b.len() == 19
            && b[8] == b'T'
            && b[18] == b'Z'
            && b[..8].iter().chain(&b[9..18]).all(u8::is_ascii_digit);
        if !shape_ok {
            return Err(bad());
        }
        // Safe to slice: every byte was checked to be ASCII above.
        let num = |from: usize, to: usize| s[from..to].parse::<u32>().map_err(|_| bad());
        let date =
            NaiveDate::from_ymd_opt(num(0, 4)? as i32, num(4, 6)?, num(6, 8)?).ok_or_else(bad)?;
        let time = date
            .and_hms_milli_opt(num(9, 11)?, num(11, 13)?, num(13, 15)?, num(15, 18)?)
            .ok_or_else(bad)?;
        Ok(Self::from_millis(time.and_utc().timestamp_millis()))
    }

    /// The instant as a chrono value (always representable by construction).
    fn datetime(self) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(self.0).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// The instant in `layout`, its digits written straight into a
    /// buffer: a device's record saves up to 32 of them, and a process's
    /// file names hundreds, at every step, so neither goes through the
    /// formatting machinery piece by piece.
    fn render<const N: usize>(self, layout: &Layout<N>) -> Rendered<N> {
        let t = self.datetime();
        // Within the range the year is 0–9999 by construction.
        let year = u32::try_from(t.year()).unwrap_or(0);
        let fields = [
            year,
            t.month(),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.timestamp_subsec_millis(),
        ];
        let mut out = layout.template;
        for ((at, width), mut n) in layout.fields.into_iter().zip(WIDTHS).zip(fields) {
            for b in out[at..at + width].iter_mut().rev() {
                *b = b'0' + (n % 10) as u8;
                n /= 10;
            }
        }
        Rendered(out)
    }
}

/// The digits of year, month, day, hour, minute, second and millisecond.
const WIDTHS: [usize; 7] = [4, 2, 2, 2, 2, 2, 3];

/// Where a written form puts each field: its fixed bytes, and the offset of
/// each field's digits (as wide as [`WIDTHS`] says).
struct Layout<const N: usize> {
    template: [u8; N],
    fields: [usize; 7],
}

/// `YYYYMMDDTHHMMSSmmmZ`, the form of file names.
const COMPACT: Layout<19> = Layout {
    template: *b"00000000T000000000Z",
    fields: [0, 4, 6, 9, 11, 13, 15],
};

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`, RFC 3339 with milliseconds.
const RFC3339: Layout<24> = Layout {
    template: *b"0000-00-00T00:00:00.000Z",
    fields: [0, 5, 8, 11, 14, 17, 20],
};

/// A form [`Timestamp::render`] wrote: ASCII digits in an ASCII template.
struct Rendered<const N: usize>([u8; N]);

impl<const N: usize> Rendered<N> {
    fn as_str(&self) -> &str {
        // Only ASCII digits are written into ASCII templates.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.render(&RFC3339).as_str())
    }
}

impl FromStr for Timestamp {
    type Err = TimestampError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_rfc3339(s)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.render(&RFC3339).as_str())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::parse_rfc3339(&s).map_err(serde::de::Error::custom)
    }
}

impl PartialSchema for Timestamp {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
            .description(Some("RFC 3339 UTC time with milliseconds"))
            .into()
    }
}

impl ToSchema for Timestamp {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip_with_millis() {
        let t = Timestamp::parse_rfc3339("2026-11-25T10:00:00.123Z").unwrap();
        assert_eq!(t.to_string(), "2026-11-25T10:00:00.123Z");
        assert_eq!(t.to_compact(), "20261125T100000123Z");
        assert_eq!(Timestamp::parse_compact("20261125T100000123Z").unwrap(), t);
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, "\"2026-11-25T10:00:00.123Z\"");
        assert_eq!(serde_json::from_str::<Timestamp>(&json).unwrap(), t);
    }

    #[test]
    fn offsets_and_long_fractions_are_normalized() {
        let t = Timestamp::parse_rfc3339("2026-11-25T12:00:00.123456+02:00").unwrap();
        assert_eq!(t.to_string(), "2026-11-25T10:00:00.123Z");
    }

    #[test]
    fn out_of_range_is_clamped() {
        let t = Timestamp::parse_rfc3339("9999-12-31T23:59:59.999-10:00").unwrap();
        assert_eq!(t, Timestamp::MAX);
        assert_eq!(Timestamp::MAX.to_compact(), "99991231T235959999Z");
        assert_eq!(Timestamp::MIN.to_compact(), "00000101T000000000Z");
        assert_eq!(Timestamp::MAX.to_string(), "9999-12-31T23:59:59.999Z");
        assert_eq!(Timestamp::MIN.to_string(), "0000-01-01T00:00:00.000Z");
        assert_eq!(Timestamp::from_millis(i64::MIN), Timestamp::MIN);
        assert_eq!(Timestamp::from_millis(i64::MAX), Timestamp::MAX);
        let before = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(Timestamp::from_system_time(before).as_millis(), -1000);
        assert_eq!(Timestamp::from_millis(-1000).to_system_time(), before);
    }

    proptest::proptest! {
        /// Both forms are chrono's, for any instant of the range.
        #[test]
        fn forms_are_chronos(ms in Timestamp::MIN.0..=Timestamp::MAX.0) {
            let t = Timestamp::from_millis(ms);
            let c = t.datetime();
            proptest::prop_assert_eq!(
                t.to_string(),
                c.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            );
            proptest::prop_assert_eq!(
                t.to_compact(),
                c.format("%Y%m%dT%H%M%S%3fZ").to_string()
            );
            proptest::prop_assert_eq!(Timestamp::parse_compact(&t.to_compact()).unwrap(), t);
            proptest::prop_assert_eq!(t.to_string().parse::<Timestamp>().unwrap(), t);
        }
    }

    #[test]
    fn garbage_is_an_error() {
        for bad in ["", "yesterday", "2026-13-01T00:00:00Z", "2026-11-25"] {
            assert!(Timestamp::parse_rfc3339(bad).is_err(), "{bad}");
        }
        for bad in [
            "",
            "20261125T100000123",
            "20261325T100000123Z",
            "2026112xT100000123Z",
        ] {
            assert!(Timestamp::parse_compact(bad).is_err(), "{bad}");
        }
    }
}
