//! [`FileName`]: the name of a message file, which carries everything that
//! routing, filtering, listing and retention need.
//!
//! `<created_at>_<message id>_<from>_<to>_<subsystem>.msg`, e.g.
//! `20261125T100000123Z_01JD6Y…_phone-1_db-a_sales.msg`. The time is the
//! fixed-width [`Timestamp::to_compact`] form and the message id a ULID, so
//! names sort by creation time and then by arrival. Ids never contain `_`,
//! so the fields split unambiguously. The longest name (three 64-character
//! ids) is 245 bytes, under the usual 255-byte limit; the temporary name of
//! a write adds 10 (255 in all).

use std::fmt;
use std::str::FromStr;

use crate::error::FileNameError;
use crate::id::Id;
use crate::timestamp::Timestamp;
use crate::ulid_ids::MessageId;
use crate::wire::Message;

/// The parsed name of a message file.
///
/// Ordering is the chronological order of the API (oldest `created_at`
/// first, then arrival), and agrees with the byte order of the names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileName {
    /// The sender's creation time.
    pub created_at: Timestamp,
    /// The server-assigned message id.
    pub id: MessageId,
    /// The sender.
    pub from: Id,
    /// The recipient.
    pub to: Id,
    /// The subsystem.
    pub subsystem: Id,
}

// Names, and the temporary names of writes (a dot before, `.<run>.tmp`
// after), stay within the 255-byte limit of common file systems.
const _: () = assert!(FileName::MAX_LEN + 10 <= 255);

impl FileName {
    /// The suffix of every message file.
    pub const SUFFIX: &'static str = ".msg";

    /// The longest possible name, in bytes.
    pub const MAX_LEN: usize = 19 + 1 + MessageId::LEN + 3 * (1 + Id::MAX_LEN) + Self::SUFFIX.len();

    /// The name of the file that holds `message`.
    pub fn of(message: &Message) -> Self {
        Self {
            created_at: message.created_at,
            id: message.id,
            from: message.from.clone(),
            to: message.to.clone(),
            subsystem: message.subsystem.clone(),
        }
    }
}

/// Stored as its name (in session records: a step's file operations, a
/// process's messages and replies, a device's idempotency keys), written
/// whole on the stack first: a serializer given the pieces `Display` makes
/// escapes each on its own, and a record holding hundreds of names is
/// saved at every step.
impl serde::Serialize for FileName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut text = NameText {
            bytes: [0; Self::MAX_LEN],
            len: 0,
        };
        match fmt::Write::write_fmt(&mut text, format_args!("{self}")) {
            Ok(()) => s.serialize_str(text.as_str()),
            // A name is never longer than `MAX_LEN`.
            Err(fmt::Error) => s.collect_str(self),
        }
    }
}

/// A [`FileName`] written out, on the stack.
struct NameText {
    bytes: [u8; FileName::MAX_LEN],
    len: usize,
}

impl NameText {
    fn as_str(&self) -> &str {
        // Only whole `str`s are written in.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

impl fmt::Write for NameText {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let room = self.bytes.get_mut(self.len..end).ok_or(fmt::Error)?;
        room.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

impl<'de> serde::Deserialize<'de> for FileName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for FileName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.created_at.write_compact(f)?;
        f.write_str("_")?;
        fmt::Display::fmt(&self.id, f)?;
        for id in [&self.from, &self.to, &self.subsystem] {
            f.write_str("_")?;
            f.write_str(id.as_str())?;
        }
        f.write_str(Self::SUFFIX)
    }
}

impl FromStr for FileName {
    type Err = FileNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let shape = || FileNameError::Shape(s.to_owned());
        let stem = s.strip_suffix(Self::SUFFIX).ok_or_else(shape)?;
        let mut parts = stem.split('_');
        let mut next = || parts.next().ok_or_else(shape);
        let (time, id, from, to, subsystem) = (next()?, next()?, next()?, next()?, next()?);
        if parts.next().is_some() {
            return Err(shape());
        }
        let created_at =
            Timestamp::parse_compact(time).map_err(|_| FileNameError::Time(time.to_owned()))?;
        let name = Self {
            created_at,
            id: id.parse()?,
            from: Id::new(from)?,
            to: Id::new(to)?,
            subsystem: Id::new(subsystem)?,
        };
        // A name is accepted only in its canonical spelling, so that parsing
        // and printing are inverse and no two names denote one message.
        if name.to_string() != s {
            return Err(shape());
        }
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FileName {
        FileName {
            created_at: Timestamp::parse_rfc3339("2026-11-25T10:00:00.123Z").unwrap(),
            id: MessageId::from_parts(1_764_064_800_123, 42),
            from: Id::new("phone-1").unwrap(),
            to: Id::new("db-a").unwrap(),
            subsystem: Id::new("sales").unwrap(),
        }
    }

    #[test]
    fn round_trip() {
        let n = sample();
        let s = n.to_string();
        assert!(s.starts_with("20261125T100000123Z_"));
        assert!(s.ends_with("_phone-1_db-a_sales.msg"));
        assert_eq!(s.parse::<FileName>().unwrap(), n);
    }

    /// Serialized as its name, the longest possible one included.
    #[test]
    fn serialized_as_its_name() {
        let longest = Id::new("x".repeat(Id::MAX_LEN)).unwrap();
        let names = [
            sample(),
            FileName {
                from: longest.clone(),
                to: longest.clone(),
                subsystem: longest,
                ..sample()
            },
        ];
        assert_eq!(names[1].to_string().len(), FileName::MAX_LEN);
        for n in names {
            let json = serde_json::to_string(&n).unwrap();
            assert_eq!(json, format!("\"{n}\""));
            assert_eq!(serde_json::from_str::<FileName>(&json).unwrap(), n);
        }
    }

    /// The name's time is the timestamp's compact form, over the whole
    /// range, leap days, century years and the ends of days included.
    #[test]
    fn the_time_is_the_compact_form() {
        let days = [
            "0000-01-01T00:00:00.000Z",
            "0000-02-29T23:59:59.999Z",
            "1600-02-29T12:00:00.000Z",
            "1900-02-28T23:59:59.999Z",
            "1900-03-01T00:00:00.000Z",
            "1969-12-31T23:59:59.999Z",
            "1970-01-01T00:00:00.000Z",
            "2000-02-29T00:00:00.001Z",
            "2026-11-25T10:00:00.123Z",
            "9999-12-31T23:59:59.999Z",
        ];
        let mut times: Vec<Timestamp> = days
            .iter()
            .map(|d| Timestamp::parse_rfc3339(d).unwrap())
            .collect();
        times.extend([Timestamp::MIN, Timestamp::MAX]);
        // A spread of instants across the range, at odd offsets.
        let span = Timestamp::MAX.as_millis() - Timestamp::MIN.as_millis();
        times.extend((0..20_000).map(|i| {
            Timestamp::from_millis(Timestamp::MIN.as_millis() + span / 20_000 * i + i * 7_919)
        }));
        for t in times {
            let n = FileName {
                created_at: t,
                ..sample()
            };
            assert_eq!(n.to_string()[..19], t.to_compact(), "{t:?}");
        }
    }

    #[test]
    fn rejects_foreign_names() {
        let good = sample().to_string();
        let bad = [
            String::new(),
            ".tmp".to_owned(),
            good.trim_end_matches(".msg").to_owned(),
            good.replace("_sales", "_sales_extra"),
            good.replace("_sales", ""),
            good.replace("phone-1", "phone/1"),
            good.replace("20261125T", "20261325T"),
            good.to_lowercase(),
        ];
        for b in bad {
            assert!(b.parse::<FileName>().is_err(), "{b}");
        }
    }
}
