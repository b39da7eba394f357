//! The `estafeta` binary and the lifecycle of `run`: help texts, the
//! generated admin token, configuration precedence, the admin subcommands,
//! and graceful shutdown (SIGTERM, in-flight calls finished).

use std::os::unix::fs::PermissionsExt;

use crate::common;
use crate::common::{
    Binary, CREATE_PHONE_1, TestServer, estafeta, id, message, outcome, provision_one, start_ok,
    start_request, wait_ready,
};
use estafeta_client::Client;
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::StartStatus;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SETTINGS: [&str; 10] = [
    "ESTAFETA_DATA_DIR",
    "ESTAFETA_LISTEN",
    "ESTAFETA_ADMIN_TOKEN",
    "ESTAFETA_MAX_FILES",
    "ESTAFETA_MAX_MB",
    "ESTAFETA_STARTED_TIMEOUT",
    "ESTAFETA_READY_TIMEOUT",
    "ESTAFETA_RETENTION",
    "ESTAFETA_MAX_BODY_MB",
    "ESTAFETA_REQUEST_TIMEOUT",
];

async fn output(cwd: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let out = estafeta(cwd).args(args).output().await.unwrap();
    outcome(out)
}

#[tokio::test]
async fn help_documents_every_command_and_setting() {
    let dir = tempfile::tempdir().unwrap();
    for args in [&["--help"][..], &["serve", "--help"]] {
        let (ok, text, _) = output(dir.path(), args).await;
        assert!(ok, "{args:?}");
        for setting in SETTINGS {
            assert!(text.contains(setting), "{args:?} lacks {setting}:\n{text}");
        }
    }
    let (_, top, _) = output(dir.path(), &["--help"]).await;
    assert!(top.contains("serve") && top.contains("admin"), "{top}");
    let (_, serve, _) = output(dir.path(), &["serve", "--help"]).await;
    assert!(serve.contains("--config"), "{serve}");
    let (_, admin, _) = output(dir.path(), &["admin", "--help"]).await;
    for word in [
        "enterprise",
        "subsystem",
        "database",
        "device",
        "processes",
        "stats",
        "--url",
        "--token",
    ] {
        assert!(admin.contains(word), "admin --help lacks {word}:\n{admin}");
    }
    let (_, device, _) = output(dir.path(), &["admin", "device", "create", "--help"]).await;
    assert!(device.contains("--subsystem"), "{device}");
}

#[tokio::test]
async fn first_start_prints_the_admin_token_and_sigterm_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Binary::serve(dir.path(), &data, &[], &[]).await;
    let token = server
        .printed_token
        .clone()
        .expect("a generated token is printed");
    // Kept only as its hash: the token itself is printed once.
    let kept = data.join(".estafeta").join("admin-token");
    let hash = estafeta_exchange::token::Token::from_text(token.clone())
        .unwrap()
        .hash()
        .to_hex();
    assert_eq!(
        std::fs::read_to_string(&kept).unwrap().trim(),
        format!("sha256:{hash}")
    );
    assert_eq!(
        std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let admin = Client::new(&server.base, &token).unwrap();
    wait_ready(&admin).await;
    admin.healthz().await.unwrap();
    let (_, phone) = provision_one(&admin).await;
    admin
        .with_token(&phone)
        .send(&message("db-a", r#"{"kept":true}"#, None))
        .await
        .unwrap();
    assert_eq!(server.terminate().await, Some(0));

    // A second start keeps the token (not printed again) and the data.
    let again = Binary::serve(dir.path(), &data, &[], &[]).await;
    assert_eq!(again.printed_token, None);
    let admin = Client::new(&again.base, &token).unwrap();
    wait_ready(&admin).await;
    let queue = admin.folder(&id("db-a"), Folder::Messages).await.unwrap();
    assert_eq!(queue.files.len(), 1);
    assert_eq!(again.terminate().await, Some(0));
}

#[tokio::test]
async fn environment_overrides_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let env_data = dir.path().join("env-data");
    std::fs::write(
        dir.path().join("estafeta.toml"),
        "data_dir = \"file-data\"\nmax_files = 1\nmax_mb = 4\nadmin_token = \"from-file-0123456789abcdef0123456789\"\n",
    )
    .unwrap();
    let server = Binary::serve(
        dir.path(),
        &env_data,
        &[],
        &[
            ("ESTAFETA_MAX_FILES", "2"),
            (
                "ESTAFETA_ADMIN_TOKEN",
                "from-env-0123456789abcdef0123456789",
            ),
        ],
    )
    .await;
    assert_eq!(server.printed_token, None);
    let admin = Client::new(&server.base, "from-env-0123456789abcdef0123456789").unwrap();
    wait_ready(&admin).await;
    let e = admin
        .with_token("from-file-0123456789abcdef0123456789")
        .stats()
        .await
        .unwrap_err();
    assert_eq!(e.status().map(|s| s.as_u16()), Some(401));
    // The environment's data folder, not the file's.
    assert!(env_data.join(".estafeta").is_dir());
    assert!(!dir.path().join("file-data").exists());

    // max_files from the environment (2) beats the file (1).
    let (db, phone) = provision_one(&admin).await;
    for n in 0..3 {
        admin
            .with_token(&phone)
            .send(&message("db-a", &n.to_string(), None))
            .await
            .unwrap();
    }
    let started = start_ok(&admin.with_token(&db), "db-a").await;
    assert_eq!(started.messages.unwrap().len(), 2);
    assert_eq!(server.terminate().await, Some(0));

    // An explicit --config file is read too (and must exist).
    std::fs::write(dir.path().join("other.toml"), "max_files = 1\n").unwrap();
    let server = Binary::serve(
        dir.path(),
        &env_data,
        &["--config", "other.toml"],
        &[(
            "ESTAFETA_ADMIN_TOKEN",
            "from-env-0123456789abcdef0123456789",
        )],
    )
    .await;
    let admin = Client::new(&server.base, "from-env-0123456789abcdef0123456789").unwrap();
    wait_ready(&admin).await;
    assert_eq!(server.terminate().await, Some(0));
    let (ok, _, err) = output(dir.path(), &["serve", "--config", "missing.toml"]).await;
    assert!(!ok);
    assert!(err.contains("missing.toml"), "{err}");
}

#[tokio::test]
async fn admin_subcommands_provision_through_the_api() {
    let dir = tempfile::tempdir().unwrap();
    let server = Binary::serve(
        dir.path(),
        &dir.path().join("data"),
        &[],
        &[(
            "ESTAFETA_ADMIN_TOKEN",
            "op-token-0123456789abcdef0123456789",
        )],
    )
    .await;
    wait_ready(&Client::new(&server.base, "op-token-0123456789abcdef0123456789").unwrap()).await;
    let admin = |args: &[&str]| {
        let mut full = vec![
            "admin",
            "--url",
            server.base.as_str(),
            "--token",
            "op-token-0123456789abcdef0123456789",
        ];
        full.extend_from_slice(args);
        let full: Vec<String> = full.into_iter().map(str::to_owned).collect();
        let cwd = dir.path().to_owned();
        async move {
            let args: Vec<&str> = full.iter().map(String::as_str).collect();
            output(&cwd, &args).await
        }
    };
    let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();

    let (ok, out, err) = admin(&["enterprise", "create", "acme"]).await;
    assert!(ok, "{err}");
    assert_eq!(json(&out)["id"], "acme");
    let (ok, _, err) = admin(&["subsystem", "create", "acme", "sales"]).await;
    assert!(ok, "{err}");
    let (ok, out, err) = admin(&["database", "create", "acme", "db-a"]).await;
    assert!(ok, "{err}");
    let db_token = json(&out)["token"].as_str().unwrap().to_owned();
    let (ok, out, err) = admin(&CREATE_PHONE_1).await;
    assert!(ok, "{err}");
    assert_eq!(json(&out)["id"], "phone-1");
    let (ok, out, _) = admin(&["processes"]).await;
    assert!(ok);
    assert_eq!(json(&out)["processes"], serde_json::json!([]));
    let (ok, out, _) = admin(&["stats"]).await;
    assert!(ok);
    assert_eq!(json(&out)["databases"][0]["id"], "db-a");

    // The database token the command printed works.
    let processor = Client::new(&server.base, &db_token).unwrap();
    let idle = processor.start(&start_request("db-a")).await.unwrap();
    assert_eq!(idle.status, StartStatus::Idle);

    // Errors: the server's answer, a nonzero exit; a bad id never leaves the terminal.
    let (ok, _, err) = admin(&["enterprise", "create", "acme"]).await;
    assert!(!ok);
    assert!(
        err.contains("409") && err.contains("already_exists"),
        "{err}"
    );
    let (ok, _, err) = admin(&["enterprise", "create", "no/slash"]).await;
    assert!(!ok);
    assert!(err.contains("no/slash"), "{err}");
    let (ok, _, err) = output(
        dir.path(),
        &["admin", "--url", &server.base, "--token", "wrong", "stats"],
    )
    .await;
    assert!(!ok);
    assert!(err.contains("401"), "{err}");
    assert_eq!(server.terminate().await, Some(0));
}

#[tokio::test]
async fn shutdown_finishes_a_call_in_flight() {
    let mut server = TestServer::start().await;
    server.admin.create_enterprise(&id("acme")).await.unwrap();
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let body = r#"{"version":1,"id":"sales"}"#;
    let head = format!(
        "POST /v1/admin/enterprises/acme/subsystems HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        server.addr,
        common::ADMIN_TOKEN,
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&body.as_bytes()[..5]).await.unwrap();
    // Make sure the server is inside the call before it is told to stop:
    // the test runtime runs tasks in spawn order, and this connection was
    // accepted (its request head already sent) before the probe's.
    assert!(server.admin.readyz().await.unwrap());
    server.signal_stop();
    tcp.write_all(&body.as_bytes()[5..]).await.unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    server.stop().await.unwrap();
}
