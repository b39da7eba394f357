//! The admin API's and the admin CLI's completeness: list, show and delete
//! enterprises, subsystems, databases and devices (paged; delete refused
//! while messages wait or a process is open, unless forced), token
//! rotation (admin token too), settling a process in doubt, requeueing and
//! discarding messages of `Unknown` and `Error`, and the reason a message
//! is in `Error`. Over real loopback HTTP, and the CLI through the binary.

use crate::common;
use crate::common::clock::ManualClock;
use crate::common::restartable::{self, Server};
use crate::common::{
    Binary, CREATE_PHONE_1, Store, Tenancy, TestServer, both_stores, estafeta, id, listed, message,
    outcome, processed, ready_process, start_ok, start_request,
};
use estafeta_client::{Client, ClientError};
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::{
    Body, CallStatus, HandAction, MessageResult, PrepareRequest, ProcessState, ResultStatus,
    Settlement, StartStatus, Version,
};
use reqwest::StatusCode;

/// The HTTP status and error code of a failed call.
fn refused<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (StatusCode, String) {
    match r.unwrap_err() {
        ClientError::Api { status, code, .. } => (status, code),
        other => panic!("not an API error: {other}"),
    }
}

fn ids<T>(items: &[T], id: impl Fn(&T) -> String) -> Vec<String> {
    items.iter().map(id).collect()
}

both_stores!(lists_page_and_deletes_are_refused_until_empty_or_forced);
async fn lists_page_and_deletes_are_refused_until_empty_or_forced(store: Store) {
    let server = TestServer::start_on(store).await;
    let admin = &server.admin;
    let t = Tenancy::provision(admin).await;

    let page = admin.enterprises(Some(1), None).await.unwrap();
    assert_eq!(ids(&page.enterprises, |e| e.id.to_string()), ["acme"]);
    assert_eq!(page.enterprises[0].subsystems, [id("sales")]);
    assert_eq!(page.next_after, Some(id("acme")));
    let page = admin.enterprises(Some(1), Some(&id("acme"))).await.unwrap();
    assert_eq!(ids(&page.enterprises, |e| e.id.to_string()), ["other"]);
    assert_eq!(page.next_after, None);

    let page = admin.databases(Some(2), None, None).await.unwrap();
    assert_eq!(ids(&page.databases, |e| e.id.to_string()), ["db-a", "db-b"]);
    let next = page.next_after.unwrap();
    let page = admin.databases(Some(2), Some(&next), None).await.unwrap();
    assert_eq!(ids(&page.databases, |e| e.id.to_string()), ["db-x"]);
    assert_eq!(page.next_after, None);
    let other = admin
        .databases(None, None, Some(&id("other")))
        .await
        .unwrap();
    assert_eq!(ids(&other.databases, |e| e.id.to_string()), ["db-x"]);
    let devices = admin.devices(None, None, Some(&id("acme"))).await.unwrap();
    assert_eq!(
        ids(&devices.devices, |e| e.id.to_string()),
        ["phone-1", "phone-2"]
    );
    assert!(
        devices
            .devices
            .iter()
            .all(|d| d.subsystem == Some(id("sales")))
    );

    // Bad paging is 400 and a non-admin is 403.
    let raw = reqwest::Client::new();
    for query in ["limit=0", "limit=1001", "after=..%2Fx", "limit=x"] {
        let r = raw
            .get(server.url(&format!("/v1/admin/databases?{query}")))
            .bearer_auth(common::ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{query}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["version"], 1, "{query}");
    }
    assert_eq!(
        refused(t.phone_x.databases(None, None, None).await).0,
        StatusCode::FORBIDDEN
    );

    let acme = admin.enterprise(&id("acme")).await.unwrap();
    assert_eq!((acme.databases, acme.devices), (2, 2));
    assert_eq!(
        refused(admin.enterprise(&id("nope")).await).0,
        StatusCode::NOT_FOUND
    );

    // A waiting message, then an open process: delete is refused and changes nothing.
    let sent = t.phone1.send(&message("db-a", "1", None)).await.unwrap();
    let shown = admin.database(&id("db-a")).await.unwrap();
    assert_eq!(shown.folders.messages, 1);
    assert!(shown.open_processes.is_empty());
    assert_eq!(
        refused(admin.delete_database(&id("db-a"), false).await),
        (StatusCode::CONFLICT, "not_empty".to_owned())
    );
    let started = start_ok(&t.db_a, "db-a").await;
    let pid = started.process_id.unwrap();
    let shown = admin.database(&id("db-a")).await.unwrap();
    assert_eq!(shown.open_processes.len(), 1);
    assert_eq!(shown.open_processes[0].process_id, pid);
    assert_eq!(
        refused(admin.delete_database(&id("db-a"), false).await),
        (StatusCode::CONFLICT, "not_empty".to_owned())
    );
    assert_eq!(
        admin.process(&pid).await.unwrap().state,
        ProcessState::Started
    );

    // Forced: the process is aborted, the message discarded, the token dead.
    let deleted = admin.delete_database(&id("db-a"), true).await.unwrap();
    assert!(deleted.forced);
    assert_eq!(deleted.discarded, 1);
    assert_eq!(deleted.ended_processes, [pid]);
    assert_eq!(
        admin.process(&pid).await.unwrap().state,
        ProcessState::Aborted
    );
    assert_eq!(
        refused(t.db_a.start(&start_request("db-a")).await).0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        refused(admin.database(&id("db-a")).await).0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        refused(t.phone1.send(&message("db-a", "2", None)).await).0,
        StatusCode::FORBIDDEN
    );
    // The id can be taken again, with an empty mailbox.
    admin
        .create_database(&id("acme"), &id("db-a"))
        .await
        .unwrap();
    let fresh = admin.database(&id("db-a")).await.unwrap();
    assert_eq!(fresh.folders, Default::default());
    let queue = listed(admin, "db-a", Folder::Messages).await;
    assert!(!queue.contains(&sent.accepted.id));

    // Empty ones go without force; an enterprise or subsystem in use does not.
    let deleted = admin.delete_database(&id("db-b"), false).await.unwrap();
    assert_eq!((deleted.forced, deleted.discarded), (false, 0));
    assert_eq!(
        refused(admin.delete_enterprise(&id("acme")).await),
        (StatusCode::CONFLICT, "in_use".to_owned())
    );
    assert_eq!(
        refused(admin.delete_subsystem(&id("acme"), &id("sales")).await),
        (StatusCode::CONFLICT, "in_use".to_owned())
    );
    // A database is not a device.
    assert_eq!(
        refused(admin.delete_device(&id("db-a"), false).await).0,
        StatusCode::NOT_FOUND
    );
    for dev in ["phone-1", "phone-2"] {
        admin.delete_device(&id(dev), false).await.unwrap();
    }
    admin.delete_database(&id("db-a"), false).await.unwrap();
    admin
        .delete_subsystem(&id("acme"), &id("sales"))
        .await
        .unwrap();
    assert!(
        admin
            .subsystems(&id("acme"))
            .await
            .unwrap()
            .subsystems
            .is_empty()
    );
    admin.delete_enterprise(&id("acme")).await.unwrap();
    let page = admin.enterprises(None, None).await.unwrap();
    assert_eq!(ids(&page.enterprises, |e| e.id.to_string()), ["other"]);

    let doc = admin.openapi().await.unwrap();
    for path in [
        "/v1/admin/enterprises/{ent}",
        "/v1/admin/databases",
        "/v1/admin/databases/{db}",
        "/v1/admin/devices/{dev}/token",
        "/v1/admin/token",
        "/v1/admin/processes/{pid}/settle",
        "/v1/admin/databases/{db}/folders/{folder}/{id}/requeue",
        "/v1/admin/databases/{db}/folders/{folder}/{id}/discard",
    ] {
        assert!(
            doc["paths"][path].is_object(),
            "{path} not in the OpenAPI document"
        );
    }
    server.stop().await.unwrap();
}

both_stores!(rotated_tokens_replace_the_old_at_once_and_a_pinned_admin_token_is_refused);
async fn rotated_tokens_replace_the_old_at_once_and_a_pinned_admin_token_is_refused(store: Store) {
    let server = TestServer::start_on(store).await;
    let admin = &server.admin;
    let t = Tenancy::provision(admin).await;
    let db = admin.rotate_database_token(&id("db-a")).await.unwrap();
    assert_eq!(
        refused(t.db_a.start(&start_request("db-a")).await).0,
        StatusCode::UNAUTHORIZED
    );
    let db_a = admin.with_token(&db.token);
    assert_eq!(
        db_a.start(&start_request("db-a")).await.unwrap().status,
        StartStatus::Idle
    );
    let dev = admin.rotate_device_token(&id("phone-1")).await.unwrap();
    assert_eq!(
        refused(t.phone1.inbox(None).await).0,
        StatusCode::UNAUTHORIZED
    );
    admin.with_token(&dev.token).inbox(None).await.unwrap();
    // The other tokens are untouched; kinds are not mixed up.
    t.phone2.inbox(None).await.unwrap();
    assert_eq!(
        refused(admin.rotate_device_token(&id("db-a")).await).0,
        StatusCode::NOT_FOUND
    );

    // The test server's admin token comes from its settings: refused, still valid.
    assert_eq!(
        refused(admin.rotate_admin_token().await),
        (StatusCode::CONFLICT, "admin_token_pinned".to_owned())
    );
    admin.stats().await.unwrap();
    assert_eq!(
        refused(t.db_b.rotate_admin_token().await).0,
        StatusCode::FORBIDDEN
    );
    server.stop().await.unwrap();
}

both_stores!(settle_requeue_discard_and_the_reason_of_an_error);
async fn settle_requeue_discard_and_the_reason_of_an_error(store: Store) {
    let (data, store, clock, server, t) = restartable::started(store).await;
    let (pid, mid) = ready_process(&t, ResultStatus::Processed).await;
    server.stop().await;
    let server = Server::start_on(data.path(), store.as_deref(), &clock).await;
    let admin = &server.admin;
    if store.is_some() {
        // A cluster node's restart leaves its processes as they are (another
        // node may be serving them): READY_TO_COMMIT is in doubt only once
        // its timeout has passed.
        assert_eq!(
            admin.process(&pid).await.unwrap().state,
            ProcessState::ReadyToCommit
        );
        let timeout = estafeta_exchange::ExchangeConfig::new(data.path()).ready_timeout;
        clock.advance(timeout + std::time::Duration::from_secs(1));
        common::cluster::eventually("the process in doubt", || async {
            let state = admin.process(&pid).await.unwrap().state;
            (state == ProcessState::InDoubt).then_some(())
        })
        .await;
    }
    // Found READY_TO_COMMIT at start-up (embedded): in doubt.
    assert_eq!(
        admin.process(&pid).await.unwrap().state,
        ProcessState::InDoubt
    );
    let shown = admin.database(&id("db-a")).await.unwrap();
    assert_eq!(shown.folders.unknown, 2);
    assert_eq!(shown.open_processes[0].state, ProcessState::InDoubt);

    // Its files are the process's to move.
    assert_eq!(
        refused(admin.requeue(&id("db-a"), Folder::Unknown, &mid).await),
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            "held_by_process".to_owned()
        )
    );
    let raw = reqwest::Client::new()
        .post(format!("{}/v1/admin/processes/{pid}/settle", server.base))
        .bearer_auth(common::ADMIN_TOKEN)
        .json(&serde_json::json!({"version": 1, "outcome": "maybe"}))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    let settled = admin.settle(&pid, Settlement::Commit).await.unwrap();
    assert_eq!(settled.status, CallStatus::Ok);
    assert_eq!(admin.process(&pid).await.unwrap().state, ProcessState::Done);
    assert_eq!(listed(admin, "phone-1", Folder::Messages).await.len(), 1);
    assert_eq!(
        refused(admin.settle(&pid, Settlement::Rollback).await),
        (StatusCode::UNPROCESSABLE_ENTITY, "not_in_doubt".to_owned())
    );

    // Two messages processed incorrectly: their reasons show in the listing.
    let db_a = admin.with_token(
        &admin
            .rotate_database_token(&id("db-a"))
            .await
            .unwrap()
            .token,
    );
    let phone = admin.with_token(
        &admin
            .rotate_device_token(&id("phone-1"))
            .await
            .unwrap()
            .token,
    );
    let a = phone
        .send(&message("db-a", "1", None))
        .await
        .unwrap()
        .accepted
        .id;
    let b = phone
        .send(&message("db-a", "2", None))
        .await
        .unwrap()
        .accepted
        .id;
    let started = db_a.start(&start_request("db-a")).await.unwrap();
    let pid2 = started.process_id.unwrap();
    let verdict = |message_id, error_code, error_text: Option<&str>| MessageResult {
        message_id,
        status: ResultStatus::ProcessedIncorrect,
        error_code,
        error_text: error_text.map(str::to_owned),
    };
    let prepare = PrepareRequest {
        version: Version,
        results: vec![
            verdict(a, Some(7), Some("bad order")),
            verdict(b, Some(8), None),
        ],
        replies: vec![],
    };
    db_a.prepare(&pid2, &prepare).await.unwrap();
    assert_eq!(db_a.commit(&pid2).await.unwrap().status, CallStatus::Ok);
    let errors = admin.folder(&id("db-a"), Folder::Error).await.unwrap();
    let reason = |m| {
        let f = errors.files.iter().find(|f| f.id == m).unwrap();
        (f.error_code, f.error_text.clone())
    };
    assert_eq!(reason(a), (Some(7), Some("bad order".to_owned())));
    assert_eq!(reason(b), (Some(8), None));

    let shown = admin.message(&id("db-a"), Folder::Error, &a).await.unwrap();
    assert_eq!(shown.body, Body::from_json("1").unwrap());
    let done = admin.requeue(&id("db-a"), Folder::Error, &a).await.unwrap();
    assert_eq!((done.id, done.action), (a, HandAction::Requeued));
    let queue = admin.folder(&id("db-a"), Folder::Messages).await.unwrap();
    assert_eq!(ids(&queue.files, |f| f.id.to_string()), [a.to_string()]);
    let done = admin.discard(&id("db-a"), Folder::Error, &b).await.unwrap();
    assert_eq!(done.action, HandAction::Discarded);
    assert!(listed(admin, "db-a", Folder::Error).await.is_empty());
    assert_eq!(
        refused(admin.discard(&id("db-a"), Folder::Error, &b).await).0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        refused(admin.requeue(&id("db-a"), Folder::Messages, &a).await),
        (StatusCode::BAD_REQUEST, "bad_folder".to_owned())
    );
    server.stop().await;
}

async fn run(
    cwd: &std::path::Path,
    base: &str,
    token: &str,
    args: &[&str],
) -> (bool, String, String) {
    let out = estafeta(cwd)
        .args(["admin", "--url", base, "--token", token])
        .args(args)
        .output()
        .await
        .unwrap();
    outcome(out)
}

both_stores!(the_cli_lists_shows_deletes_rotates_and_settles);
async fn the_cli_lists_shows_deletes_rotates_and_settles(store: Store) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = store.setting();
    let server = Binary::serve_on(store.as_deref(), dir.path(), &data, &[], &[]).await;
    let token = server.printed_token.clone().unwrap();
    common::wait_ready(&Client::new(&server.base, &token).unwrap()).await;
    let json = |text: &str| serde_json::from_str::<serde_json::Value>(text).unwrap();
    let cwd = dir.path();
    let base = server.base.as_str();

    for args in [
        &["enterprise", "create", "acme"][..],
        &["subsystem", "create", "acme", "sales"],
        &["database", "create", "acme", "db-a"],
        &["database", "create", "acme", "db-b"],
    ] {
        let (ok, _, err) = run(cwd, base, &token, args).await;
        assert!(ok, "{args:?}: {err}");
    }
    let (ok, out, err) = run(cwd, base, &token, &CREATE_PHONE_1).await;
    assert!(ok, "{err}");
    let phone = Client::new(base, json(&out)["token"].as_str().unwrap()).unwrap();

    let (ok, out, _) = run(cwd, base, &token, &["database", "list", "--limit", "1"]).await;
    assert!(ok);
    assert_eq!(json(&out)["databases"][0]["id"], "db-a");
    assert_eq!(json(&out)["next_after"], "db-a");
    let (_, out, _) = run(cwd, base, &token, &["database", "list", "--after", "db-a"]).await;
    assert_eq!(json(&out)["databases"][0]["id"], "db-b");
    let (_, out, _) = run(cwd, base, &token, &["enterprise", "show", "acme"]).await;
    assert_eq!(json(&out)["databases"], 2);
    let (_, out, _) = run(cwd, base, &token, &["subsystem", "list", "acme"]).await;
    assert_eq!(json(&out)["subsystems"][0], "sales");
    let (_, out, _) = run(
        cwd,
        base,
        &token,
        &["device", "list", "--enterprise", "acme"],
    )
    .await;
    assert_eq!(json(&out)["devices"][0]["subsystem"], "sales");

    phone.send(&message("db-a", "1", None)).await.unwrap();
    let (_, out, _) = run(cwd, base, &token, &["database", "show", "db-a"]).await;
    assert_eq!(json(&out)["folders"]["messages"], 1);
    let (ok, _, err) = run(cwd, base, &token, &["database", "delete", "db-a"]).await;
    assert!(!ok);
    assert!(err.contains("not_empty") && err.contains("force"), "{err}");
    let (ok, out, err) = run(
        cwd,
        base,
        &token,
        &["database", "delete", "db-a", "--force"],
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(json(&out)["discarded"], 1);
    assert!(
        err.contains("warning: forced delete of database db-a: 1 message files discarded"),
        "{err}"
    );
    let (ok, out, err) = run(cwd, base, &token, &["database", "delete", "db-b"]).await;
    assert!(ok && !err.contains("warning"), "{err}");
    assert_eq!(json(&out)["forced"], false);

    let (ok, out, _) = run(cwd, base, &token, &["device", "rotate-token", "phone-1"]).await;
    assert!(ok);
    assert!(phone.inbox(None).await.is_err());
    Client::new(base, json(&out)["token"].as_str().unwrap())
        .unwrap()
        .inbox(None)
        .await
        .unwrap();

    let (ok, _, err) = run(
        cwd,
        base,
        &token,
        &["settle", "01JD6Y0000000000000000000A", "commit"],
    )
    .await;
    assert!(!ok && err.contains("not_in_doubt"), "{err}");
    let (ok, _, err) = run(
        cwd,
        base,
        &token,
        &[
            "message",
            "discard",
            "phone-1",
            "Error",
            "01JD6Y0000000000000000000A",
        ],
    )
    .await;
    assert!(!ok && err.contains("not_found"), "{err}");
    let (ok, out, _) = run(cwd, base, &token, &["folder", "phone-1", "Error"]).await;
    assert!(ok);
    assert_eq!(json(&out)["files"], serde_json::json!([]));

    // The admin token, rotated without a restart: the old one stops at once,
    // the new one is saved and outlives a restart.
    let (ok, out, err) = run(cwd, base, &token, &["token", "rotate"]).await;
    assert!(ok, "{err}");
    assert!(
        err.contains("warning: the old admin token no longer works"),
        "{err}"
    );
    let new = json(&out)["token"].as_str().unwrap().to_owned();
    let (ok, _, err) = run(cwd, base, &token, &["stats"]).await;
    assert!(!ok && err.contains("401"), "{err}");
    assert!(run(cwd, base, &new, &["stats"]).await.0);
    // Only the admin token's hash is kept: in a file of the embedded
    // store, in the database of a cluster.
    if store.is_none() {
        let kept = std::fs::read_to_string(data.join(".estafeta/admin-token")).unwrap();
        assert!(
            kept.starts_with("sha256:") && !kept.contains(&new),
            "{kept}"
        );
    }
    assert_eq!(server.terminate().await, Some(0));
    let server = Binary::serve_on(store.as_deref(), dir.path(), &data, &[], &[]).await;
    assert_eq!(server.printed_token, None);
    common::wait_ready(&Client::new(&server.base, &new).unwrap()).await;
    assert!(
        run(cwd, &server.base, &new, &["enterprise", "list"])
            .await
            .0
    );
    assert!(
        !run(cwd, &server.base, &token, &["enterprise", "list"])
            .await
            .0
    );
    assert_eq!(server.terminate().await, Some(0));
}

/// A device's upload to `to`, due `after` from the clock's now.
async fn upload_due(
    phone: &Client,
    to: &str,
    clock: &ManualClock,
    after: std::time::Duration,
) -> estafeta_exchange::MessageId {
    use estafeta_session::Clock;
    let at = clock.now().after(after);
    let mut m = message(to, r#"{"later":true}"#, None);
    m.deliver_at = Some(estafeta_exchange::Timestamp::from_millis(
        i64::try_from(at.0).unwrap(),
    ));
    phone.send(&m).await.unwrap().accepted.id
}

/// Waits until `wanted` is in `mailbox`'s `Messages`.
async fn wait_in(server: &Server, mailbox: &str, wanted: estafeta_exchange::MessageId) {
    common::cluster::eventually("the scheduled message delivered", || async {
        server
            .queued_at(mailbox)
            .await
            .contains(&wanted)
            .then_some(())
    })
    .await;
}

both_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_deleted_mailbox_takes_nothing_more_and_comes_back_empty
);
/// A database or device with a message waiting for its `deliver_at`: a
/// plain delete is refused (409), a forced one discards it, and nothing of
/// it ever lands under the id, not in one made again under it when the
/// time comes; a reply committed for a device deleted meanwhile is
/// discarded, not delivered to the device made again.
async fn a_deleted_mailbox_takes_nothing_more_and_comes_back_empty(store: Store) {
    let (_data, _, clock, server, t) = restartable::started(store).await;
    let admin = &server.admin;
    let hour = std::time::Duration::from_secs(3600);

    // The database: its scheduled message refuses a plain delete.
    upload_due(&t.phone1, "db-a", &clock, hour).await;
    let (status, code) = refused(admin.delete_database(&id("db-a"), false).await);
    assert_eq!((status, code.as_str()), (StatusCode::CONFLICT, "not_empty"));
    let deleted = admin.delete_database(&id("db-a"), true).await.unwrap();
    assert_eq!(deleted.discarded, 1);
    let refused_upload = refused(t.phone1.send(&message("db-a", "{}", None)).await);
    assert_eq!(refused_upload.0, StatusCode::FORBIDDEN);
    let again = admin
        .create_database(&id("acme"), &id("db-a"))
        .await
        .unwrap();
    let db_a = admin.with_token(&again.token);

    // The device: a reply due in an hour, and one prepared for it.
    let sent = t.phone2.send(&message("db-b", "{}", None)).await.unwrap();
    let started = t.db_b.start(&start_request("db-b")).await.unwrap();
    let pid = started.process_id.unwrap();
    let due = {
        use estafeta_session::Clock;
        clock.now().after(hour)
    };
    let reply = |deliver_at| estafeta_exchange::wire::Reply {
        deliver_at,
        ..common::reply(id("phone-2"), r#"{"reply":true}"#)
    };
    let prepare = PrepareRequest {
        version: Version,
        results: vec![processed(sent.accepted.id)],
        replies: vec![
            reply(Some(estafeta_exchange::Timestamp::from_millis(
                i64::try_from(due.0).unwrap(),
            ))),
            reply(None),
        ],
    };
    assert_eq!(
        t.db_b.prepare(&pid, &prepare).await.unwrap().status,
        CallStatus::Ok
    );
    // Deleted with the replies still prepared: they go nowhere.
    let deleted = admin.delete_device(&id("phone-2"), false).await.unwrap();
    assert_eq!(deleted.discarded, 0);
    assert_eq!(t.db_b.commit(&pid).await.unwrap().status, CallStatus::Ok);
    assert_eq!(
        listed(admin, "db-b", Folder::Prepared).await.len(),
        0,
        "the replies were discarded, not left behind"
    );
    let phone2 = admin
        .create_device(&id("acme"), &id("phone-2"), &id("sales"))
        .await
        .unwrap();
    let phone2 = admin.with_token(&phone2.token);

    // The hour passes; a message due after the discarded ones is delivered,
    // and the mailboxes made again are still empty.
    let control = upload_due(&t.phone1, "db-b", &clock, hour).await;
    clock.advance(hour + std::time::Duration::from_secs(2));
    wait_in(&server, "db-b", control).await;
    assert_eq!(
        db_a.start(&start_request("db-a")).await.unwrap().status,
        StartStatus::Idle
    );
    assert!(phone2.inbox(None).await.unwrap().messages.is_empty());
    server.stop().await;
}
