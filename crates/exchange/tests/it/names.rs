//! Properties of message file names: they round-trip, and their byte order
//! is the chronological order of the messages.

use estafeta_exchange::mailbox::FileName;
use estafeta_exchange::{Id, MessageId, Timestamp};
use proptest::prelude::*;

fn any_id() -> impl Strategy<Value = Id> {
    "[A-Za-z0-9][A-Za-z0-9.-]{0,63}".prop_map(|s| Id::new(s).unwrap())
}

fn any_name() -> impl Strategy<Value = FileName> {
    (
        Timestamp::MIN.as_millis()..=Timestamp::MAX.as_millis(),
        0u64..(1 << 48),
        any::<u128>(),
        any_id(),
        any_id(),
        any_id(),
    )
        .prop_map(|(ms, arrived, random, from, to, subsystem)| FileName {
            created_at: Timestamp::from_millis(ms),
            id: MessageId::from_parts(arrived, random),
            from,
            to,
            subsystem,
        })
}

proptest! {
    #[test]
    fn names_round_trip(name in any_name()) {
        let text = name.to_string();
        prop_assert!(text.len() <= FileName::MAX_LEN);
        prop_assert!(!text.starts_with('.'));
        prop_assert_eq!(text.parse::<FileName>().unwrap(), name);
    }

    #[test]
    fn byte_order_is_created_at_then_arrival(a in any_name(), b in any_name()) {
        let by_time = (a.created_at, a.id).cmp(&(b.created_at, b.id));
        prop_assert_eq!(a.to_string().cmp(&b.to_string()), by_time);
        // Message ids are unique, so (created_at, id) never ties between two files.
        if by_time != std::cmp::Ordering::Equal {
            prop_assert_eq!(a.cmp(&b), by_time);
        }
    }

    #[test]
    fn same_time_orders_by_id(a in any_name(), arrived in 0u64..(1 << 48), random in any::<u128>()) {
        let mut b = a.clone();
        b.id = MessageId::from_parts(arrived, random);
        prop_assert_eq!(a.to_string().cmp(&b.to_string()), a.id.cmp(&b.id));
    }

    #[test]
    fn compact_time_round_trips(ms in Timestamp::MIN.as_millis()..=Timestamp::MAX.as_millis()) {
        let t = Timestamp::from_millis(ms);
        prop_assert_eq!(Timestamp::parse_compact(&t.to_compact()).unwrap(), t);
        prop_assert_eq!(t.to_string().parse::<Timestamp>().unwrap(), t);
    }
}
