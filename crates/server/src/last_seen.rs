//! [`LastSeen`]: when each database and device last made an authenticated
//! call, for the dashboard. Kept in memory only: it starts empty at every
//! start of the server.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::SystemTime;

use estafeta_exchange::Id;
use estafeta_exchange::tenancy::Principal;

/// The last call of each database and device.
#[derive(Default)]
pub struct LastSeen {
    map: Mutex<HashMap<Id, SystemTime>>,
}

impl LastSeen {
    /// Notes a call by `who` at `now` (the administrator is not tracked).
    pub fn saw(&self, who: &Principal, now: SystemTime) {
        let id = match who {
            Principal::Admin => return,
            Principal::Database { id, .. } | Principal::Device { id, .. } => id,
        };
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(id.clone(), now);
    }

    /// When `id` last called, if it did since the server started.
    pub fn get(&self, id: &Id) -> Option<SystemTime> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn remembers_the_last_call_of_devices_and_databases() {
        let seen = LastSeen::default();
        let dev: Id = "phone-1".parse().unwrap();
        let who = Principal::Device {
            id: dev.clone(),
            enterprise: "acme".parse().unwrap(),
            subsystem: "sales".parse().unwrap(),
        };
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        assert_eq!(seen.get(&dev), None);
        seen.saw(&who, t);
        seen.saw(&who, t + Duration::from_secs(5));
        seen.saw(&Principal::Admin, t);
        assert_eq!(seen.get(&dev), Some(t + Duration::from_secs(5)));
    }
}
