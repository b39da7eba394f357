//! The tenancy registry on a real redb file in a temporary folder.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::common::id;
use estafeta_exchange::tenancy::{AdminToken, Principal, Registry, Role};
use estafeta_exchange::token::Token;
use estafeta_exchange::{DataLayout, TenancyError};

async fn open(dir: &Path, admin: Option<&str>) -> (Registry, AdminToken) {
    Registry::open(&DataLayout::new(dir), admin.map(str::to_owned))
        .await
        .unwrap()
}

/// An enterprise "acme" with subsystem "sales"; returns the registry.
async fn acme(dir: &Path) -> Registry {
    let (reg, _) = open(dir, Some("admin-secret")).await;
    reg.create_enterprise(id("acme")).await.unwrap();
    reg.create_subsystem(id("acme"), id("sales")).await.unwrap();
    reg
}

/// The tokens of a new database db-a and a new device phone-1 (sales) of
/// acme.
async fn db_and_phone(reg: &Registry) -> (Token, Token) {
    let db = reg.create_database(id("acme"), id("db-a")).await.unwrap();
    let phone = reg.create_device(id("acme"), id("phone-1"), id("sales"));
    (db, phone.await.unwrap())
}

#[tokio::test]
async fn tokens_authenticate_their_owners() {
    let dir = tempfile::tempdir().unwrap();
    let reg = acme(dir.path()).await;
    let (db, phone) = db_and_phone(&reg).await;
    assert_ne!(db, phone);

    assert_eq!(reg.authenticate("admin-secret"), Some(Principal::Admin));
    assert_eq!(
        reg.authenticate(db.expose()),
        Some(Principal::Database {
            id: id("db-a"),
            enterprise: id("acme")
        })
    );
    assert_eq!(
        reg.authenticate(phone.expose()),
        Some(Principal::Device {
            id: id("phone-1"),
            enterprise: id("acme"),
            subsystem: id("sales")
        })
    );
    for wrong in [
        "",
        "admin-secre",
        "admin-secret ",
        &db.expose()[1..],
        &phone.expose().to_uppercase(),
    ] {
        assert_eq!(reg.authenticate(wrong), None, "{wrong:?}");
    }
}

#[tokio::test]
async fn duplicates_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let reg = acme(dir.path()).await;
    reg.create_enterprise(id("globex")).await.unwrap();
    reg.create_subsystem(id("globex"), id("sales"))
        .await
        .unwrap();
    reg.create_database(id("acme"), id("db-a")).await.unwrap();

    let dup = |r: Result<_, TenancyError>| matches!(r, Err(TenancyError::AlreadyExists { .. }));
    assert!(dup(reg.create_enterprise(id("acme")).await));
    assert!(dup(reg.create_subsystem(id("acme"), id("sales")).await));
    // Database and device ids share one namespace across all enterprises.
    assert!(dup(reg
        .create_database(id("acme"), id("db-a"))
        .await
        .map(drop)));
    assert!(dup(reg
        .create_database(id("globex"), id("db-a"))
        .await
        .map(drop)));
    assert!(dup(reg
        .create_device(id("globex"), id("db-a"), id("sales"))
        .await
        .map(drop)));
    // The refused calls changed nothing.
    assert_eq!(reg.enterprise_of(&id("db-a")), Some(id("acme")));
    assert_eq!(reg.databases().len(), 1);
    assert!(reg.devices().is_empty());
}

#[tokio::test]
async fn unknown_parents_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let reg = acme(dir.path()).await;
    assert!(matches!(
        reg.create_subsystem(id("nope"), id("sales")).await,
        Err(TenancyError::UnknownEnterprise(_))
    ));
    assert!(matches!(
        reg.create_database(id("nope"), id("db-x")).await,
        Err(TenancyError::UnknownEnterprise(_))
    ));
    assert!(matches!(
        reg.create_device(id("acme"), id("phone-x"), id("stock"))
            .await,
        Err(TenancyError::UnknownSubsystem { .. })
    ));
    assert!(reg.endpoint(&id("phone-x")).is_none());
}

#[tokio::test]
async fn lookups_answer_the_servers_questions() {
    let dir = tempfile::tempdir().unwrap();
    let reg = acme(dir.path()).await;
    reg.create_enterprise(id("globex")).await.unwrap();
    reg.create_database(id("globex"), id("db-g")).await.unwrap();
    reg.create_database(id("acme"), id("db-b")).await.unwrap();
    reg.create_database(id("acme"), id("db-a")).await.unwrap();
    reg.create_device(id("acme"), id("phone-1"), id("sales"))
        .await
        .unwrap();

    assert!(reg.is_database_of(&id("db-a"), &id("acme")));
    assert!(!reg.is_database_of(&id("db-g"), &id("acme")));
    assert!(!reg.is_database_of(&id("phone-1"), &id("acme")));
    assert!(!reg.is_database_of(&id("ghost"), &id("acme")));
    assert_eq!(reg.enterprise_of(&id("db-g")), Some(id("globex")));
    assert_eq!(reg.enterprise_of(&id("ghost")), None);
    assert_eq!(reg.device_subsystem(&id("phone-1")), Some(id("sales")));
    assert_eq!(reg.device_subsystem(&id("db-a")), None);
    let dbs: Vec<_> = reg.databases().into_iter().map(|e| e.id).collect();
    assert_eq!(dbs, vec![id("db-a"), id("db-b"), id("db-g")]);
    let devices = reg.devices();
    assert_eq!(devices.len(), 1);
    assert_eq!(
        devices[0].role,
        Role::Device {
            subsystem: id("sales")
        }
    );
    assert_eq!(reg.enterprises(), vec![id("acme"), id("globex")]);
    assert_eq!(reg.subsystems(&id("acme")), vec![id("sales")]);
    assert!(reg.enterprise_exists(&id("globex")));
}

#[tokio::test]
async fn everything_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (db_token, phone_token) = db_and_phone(&acme(dir.path()).await).await;
    let (reg, _) = open(dir.path(), Some("admin-secret")).await;
    assert!(matches!(
        reg.authenticate(db_token.expose()),
        Some(Principal::Database { .. })
    ));
    assert!(matches!(
        reg.authenticate(phone_token.expose()),
        Some(Principal::Device { .. })
    ));
    assert_eq!(reg.subsystems(&id("acme")), vec![id("sales")]);
    assert!(matches!(
        reg.create_enterprise(id("acme")).await,
        Err(TenancyError::AlreadyExists { .. })
    ));
    // Only the hash is stored: the token text is nowhere in the state folder.
    for entry in std::fs::read_dir(dir.path().join(".estafeta")).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        let needle = db_token.expose().as_bytes();
        assert!(!bytes.windows(needle.len()).any(|w| w == needle));
    }
}

#[tokio::test]
async fn the_admin_token_is_made_once_and_kept_private() {
    let dir = tempfile::tempdir().unwrap();
    let token = {
        let (reg, origin) = open(dir.path(), None).await;
        let AdminToken::Generated(token) = origin else {
            panic!("expected a generated token, got {origin:?}");
        };
        assert_eq!(reg.authenticate(token.expose()), Some(Principal::Admin));
        token
    };
    let file = dir.path().join(".estafeta").join("admin-token");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    let (reg, origin) = open(dir.path(), None).await;
    assert_eq!(origin, AdminToken::Existing);
    assert_eq!(reg.authenticate(token.expose()), Some(Principal::Admin));
    drop(reg);

    // A configured token replaces the saved one for as long as it is set.
    let (reg, origin) = open(dir.path(), Some("from-env")).await;
    assert_eq!(origin, AdminToken::Configured);
    assert_eq!(reg.authenticate("from-env"), Some(Principal::Admin));
    assert_eq!(reg.authenticate(token.expose()), None);
}

#[tokio::test]
async fn a_bad_configured_admin_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::open(&DataLayout::new(dir.path()), Some(" padded ".to_owned())).await;
    assert!(matches!(r, Err(TenancyError::BadAdminToken)));
}

/// Changes reach the store and the copy in memory in the same order: after
/// many concurrent rotations of one token, the token the running registry
/// accepts is the one the store kept (the one a restart accepts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_rotations_leave_memory_and_store_agreeing() {
    let dir = tempfile::tempdir().unwrap();
    let reg = acme(dir.path()).await;
    reg.create_database(id("acme"), id("db-a")).await.unwrap();
    let rotations: Vec<_> = (0..16)
        .map(|_| {
            let reg = reg.clone();
            tokio::spawn(async move {
                reg.rotate_token(estafeta_exchange::tenancy::Kind::Database, id("db-a"))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for r in rotations {
        tokens.push(r.await.unwrap());
    }
    let accepted: Vec<_> = tokens
        .iter()
        .filter(|t| reg.authenticate(t.expose()).is_some())
        .collect();
    assert_eq!(accepted.len(), 1);
    drop(reg);
    let (reopened, _) = open(dir.path(), Some("admin-secret")).await;
    assert!(reopened.authenticate(accepted[0].expose()).is_some());
}
