//! End to end through the typed client over real HTTP: provisioning, device
//! uploads, the process cycle, status words and authorization.

use crate::common::{
    Store, Tenancy, TestServer, both_stores, id, listed, message, processed, reply, start_ok,
    start_request,
};
use estafeta_client::{ClientError, Upload};
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::{
    Body, CallStatus, PrepareRequest, ProcessState, StartStatus, Version,
};
use estafeta_exchange::{MessageId, ProcessId};

fn api_status(e: &ClientError) -> (u16, &str) {
    (e.status().map_or(0, |s| s.as_u16()), e.code().unwrap_or(""))
}

both_stores!(admin_provisioning);
async fn admin_provisioning(store: Store) {
    let server = TestServer::start_on(store).await;
    let admin = &server.admin;
    let created = admin.create_enterprise(&id("acme")).await.unwrap();
    assert_eq!(created.id, id("acme"));
    let e = admin.create_enterprise(&id("acme")).await.unwrap_err();
    assert_eq!(api_status(&e), (409, "already_exists"));

    let e = admin
        .create_subsystem(&id("nobody"), &id("sales"))
        .await
        .unwrap_err();
    assert_eq!(api_status(&e).0, 404);
    admin
        .create_subsystem(&id("acme"), &id("sales"))
        .await
        .unwrap();

    let db = admin
        .create_database(&id("acme"), &id("db-a"))
        .await
        .unwrap();
    assert_eq!(db.id, id("db-a"));
    assert!(db.token.len() >= 32);
    // Database and device ids share one namespace.
    let e = admin
        .create_device(&id("acme"), &id("db-a"), &id("sales"))
        .await
        .unwrap_err();
    assert_eq!(api_status(&e).0, 409);
    let e = admin
        .create_device(&id("acme"), &id("phone-1"), &id("no-such-app"))
        .await
        .unwrap_err();
    assert_eq!(api_status(&e).0, 404);
    let phone = admin
        .create_device(&id("acme"), &id("phone-1"), &id("sales"))
        .await
        .unwrap();
    assert_ne!(phone.token, db.token);

    // The new tokens work, and only for their own role.
    let processor = server.client(&db.token);
    let idle = processor.start(&start_request("db-a")).await.unwrap();
    assert_eq!(idle.status, StartStatus::Idle);
    for non_admin in [&db.token, &phone.token] {
        let e = server.client(non_admin).stats().await.unwrap_err();
        assert_eq!(api_status(&e), (403, "forbidden"));
        let e = server
            .client(non_admin)
            .create_enterprise(&id("evil"))
            .await
            .unwrap_err();
        assert_eq!(api_status(&e), (403, "forbidden"));
    }
    let stats = admin.stats().await.unwrap();
    assert_eq!(stats.databases.len(), 1);
    assert_eq!(stats.devices.len(), 1);
    server.stop().await.unwrap();
}

both_stores!(device_upload_is_idempotent_per_key);
async fn device_upload_is_idempotent_per_key(store: Store) {
    let server = TestServer::start_on(store).await;
    let t = Tenancy::provision(&server.admin).await;
    let first = t
        .phone1
        .send(&message("db-a", r#"{"order":1}"#, Some("k-1")))
        .await
        .unwrap();
    assert_eq!(first.upload, Upload::Created);
    let again = t
        .phone1
        .send(&message("db-a", r#"{"order":1}"#, Some("k-1")))
        .await
        .unwrap();
    assert_eq!(again.upload, Upload::Repeated);
    assert_eq!(again.accepted.id, first.accepted.id);
    // The same key from another device is another message.
    let other = t
        .phone2
        .send(&message("db-a", r#"{"order":1}"#, Some("k-1")))
        .await
        .unwrap();
    assert_eq!(other.upload, Upload::Created);
    assert_ne!(other.accepted.id, first.accepted.id);
    let queue = listed(&server.admin, "db-a", Folder::Messages).await;
    assert_eq!(queue.len(), 2);
    server.stop().await.unwrap();
}

both_stores!(full_process_cycle_with_busy_and_idle);
async fn full_process_cycle_with_busy_and_idle(store: Store) {
    let server = TestServer::start_on(store).await;
    let t = Tenancy::provision(&server.admin).await;
    let mut sent = Vec::new();
    for n in 0..3 {
        let s = t
            .phone1
            .send(&message("db-a", &format!(r#"{{"order":{n}}}"#), None))
            .await
            .unwrap();
        assert_eq!(s.upload, Upload::Created);
        sent.push(s.accepted.id);
    }

    // API_1: the three messages, oldest first.
    let started = start_ok(&t.db_a, "db-a").await;
    let pid: ProcessId = started.process_id.unwrap();
    let messages = started.messages.unwrap();
    assert_eq!(messages.iter().map(|m| m.id).collect::<Vec<_>>(), sent);
    assert_eq!(messages[0].from, id("phone-1"));
    assert_eq!(messages[0].body, Body::from_json(r#"{"order":0}"#).unwrap());

    // BUSY while the process lives; the other database is not affected.
    let busy = t.db_a.start(&start_request("db-a")).await.unwrap();
    assert_eq!(busy.status, StartStatus::Busy);
    assert_eq!(
        t.db_b.start(&start_request("db-b")).await.unwrap().status,
        StartStatus::Idle
    );
    assert_eq!(
        t.db_a.process(&pid).await.unwrap().state,
        ProcessState::Started
    );

    // API_2: keep the first two; the third stays in Messages.
    let accepted = t.db_a.accept(&pid, &sent[..2]).await.unwrap();
    assert_eq!(accepted.status, CallStatus::Ok);

    // API_3: results must name the accepted messages exactly once.
    let incomplete = PrepareRequest {
        version: Version,
        results: vec![processed(sent[0])],
        replies: vec![],
    };
    let e = t.db_a.prepare(&pid, &incomplete).await.unwrap_err();
    assert_eq!(api_status(&e).0, 422);
    let prepare = PrepareRequest {
        version: Version,
        results: vec![processed(sent[0]), processed(sent[1])],
        replies: vec![reply(id("phone-1"), r#"{"done":[0,1]}"#)],
    };
    assert_eq!(
        t.db_a.prepare(&pid, &prepare).await.unwrap().status,
        CallStatus::Ok
    );
    assert_eq!(
        t.db_a.process(&pid).await.unwrap().state,
        ProcessState::ReadyToCommit
    );
    // The same prepare again is CANCELLED.
    assert_eq!(
        t.db_a.prepare(&pid, &prepare).await.unwrap().status,
        CallStatus::Cancelled
    );
    // The reply waits in the database's Prepared folder.
    let prepared = server
        .admin
        .folder(&id("db-a"), Folder::Prepared)
        .await
        .unwrap();
    assert_eq!(prepared.files.len(), 1);
    assert_eq!(prepared.files[0].to, id("phone-1"));

    // API_4: committed; a second commit answers OK again.
    assert_eq!(t.db_a.commit(&pid).await.unwrap().status, CallStatus::Ok);
    assert_eq!(t.db_a.commit(&pid).await.unwrap().status, CallStatus::Ok);
    assert_eq!(
        t.db_a.process(&pid).await.unwrap().state,
        ProcessState::Done
    );
    assert_eq!(
        t.db_a.rollback(&pid, "too late").await.unwrap().status,
        CallStatus::Cancelled
    );
    let log = server.admin.folder(&id("db-a"), Folder::Log).await.unwrap();
    assert_eq!(log.files.len(), 2);

    // The device gets the reply, acknowledges it, and it is gone.
    let inbox = t.phone1.inbox(None).await.unwrap();
    assert_eq!(inbox.messages.len(), 1);
    let reply = &inbox.messages[0];
    assert_eq!(reply.from, id("db-a"));
    assert_eq!(reply.to, id("phone-1"));
    assert_eq!(reply.body, Body::from_json(r#"{"done":[0,1]}"#).unwrap());
    assert!(t.phone2.inbox(None).await.unwrap().messages.is_empty());
    assert_eq!(t.phone1.ack(&[reply.id, sent[2]]).await.unwrap().acked, 1);
    assert!(t.phone1.inbox(Some(10)).await.unwrap().messages.is_empty());

    // The message not accepted comes again; after it, nothing waits.
    let next = t.db_a.start(&start_request("db-a")).await.unwrap();
    let next_pid = next.process_id.unwrap();
    assert_eq!(
        next.messages
            .unwrap()
            .iter()
            .map(|m| m.id)
            .collect::<Vec<_>>(),
        vec![sent[2]]
    );
    assert_eq!(
        t.db_a.abort(&next_pid, "not now").await.unwrap().status,
        CallStatus::Ok
    );
    assert_eq!(
        t.db_a.process(&next_pid).await.unwrap().state,
        ProcessState::Aborted
    );
    let again = start_ok(&t.db_a, "db-a").await;
    let last = again.process_id.unwrap();
    let all = PrepareRequest {
        version: Version,
        results: vec![processed(sent[2])],
        replies: vec![],
    };
    assert_eq!(
        t.db_a.prepare(&last, &all).await.unwrap().status,
        CallStatus::Ok
    );
    assert_eq!(t.db_a.commit(&last).await.unwrap().status, CallStatus::Ok);
    assert_eq!(
        t.db_a.start(&start_request("db-a")).await.unwrap().status,
        StartStatus::Idle
    );

    let processes = server.admin.processes().await.unwrap();
    assert!(
        processes
            .processes
            .iter()
            .any(|p| p.process_id == pid && p.state == ProcessState::Done)
    );
    server.stop().await.unwrap();
}

both_stores!(unknown_process_ids);
async fn unknown_process_ids(store: Store) {
    let server = TestServer::start_on(store).await;
    let t = Tenancy::provision(&server.admin).await;
    let never = ProcessId::from_parts(1_700_000_000_000, 42);
    let e = t.db_a.process(&never).await.unwrap_err();
    assert_eq!(api_status(&e), (404, "not_found"));
    assert_eq!(
        t.db_a.commit(&never).await.unwrap().status,
        CallStatus::Cancelled
    );
    assert_eq!(
        t.db_a.accept(&never, &[]).await.unwrap().status,
        CallStatus::Cancelled
    );
    server.stop().await.unwrap();
}

both_stores!(authorization_between_devices_databases_and_enterprises);
async fn authorization_between_devices_databases_and_enterprises(store: Store) {
    let server = TestServer::start_on(store).await;
    let t = Tenancy::provision(&server.admin).await;
    t.phone1.send(&message("db-a", "{}", None)).await.unwrap();
    let started = t.db_a.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    let ids: Vec<MessageId> = started.messages.unwrap().iter().map(|m| m.id).collect();
    let prepare = PrepareRequest {
        version: Version,
        results: vec![processed(ids[0])],
        replies: vec![reply(id("phone-1"), r#""for phone-1""#)],
    };

    // A database token cannot touch another database's process.
    let forbidden = |r: Result<_, ClientError>| {
        let e = r.unwrap_err();
        assert_eq!(api_status(&e), (403, "forbidden"), "{e}");
    };
    forbidden(t.db_b.process(&pid).await.map(drop));
    forbidden(t.db_b.prepare(&pid, &prepare).await.map(drop));
    forbidden(t.db_b.commit(&pid).await.map(drop));
    forbidden(t.db_b.abort(&pid, "not mine").await.map(drop));
    forbidden(t.db_b.start(&start_request("db-a")).await.map(drop));
    forbidden(t.db_x.process(&pid).await.map(drop));
    // Nor can a device run the protocol, or a database use the device calls.
    forbidden(t.phone1.start(&start_request("db-a")).await.map(drop));
    forbidden(t.db_a.inbox(None).await.map(drop));
    forbidden(t.db_a.send(&message("db-b", "{}", None)).await.map(drop));
    // Enterprise isolation: no sending to another enterprise's database.
    forbidden(t.phone_x.send(&message("db-a", "{}", None)).await.map(drop));
    forbidden(t.phone1.send(&message("db-x", "{}", None)).await.map(drop));
    assert_eq!(
        t.db_x.start(&start_request("db-x")).await.unwrap().status,
        StartStatus::Idle
    );

    // The process went on unharmed.
    assert_eq!(
        t.db_a.prepare(&pid, &prepare).await.unwrap().status,
        CallStatus::Ok
    );
    assert_eq!(t.db_a.commit(&pid).await.unwrap().status, CallStatus::Ok);

    // A device sees and acknowledges only its own inbox.
    let reply = t.phone1.inbox(None).await.unwrap().messages[0].id;
    assert!(t.phone2.inbox(None).await.unwrap().messages.is_empty());
    assert!(t.phone_x.inbox(None).await.unwrap().messages.is_empty());
    assert_eq!(t.phone2.ack(&[reply]).await.unwrap().acked, 0);
    assert_eq!(t.phone_x.ack(&[reply]).await.unwrap().acked, 0);
    assert_eq!(t.phone1.inbox(None).await.unwrap().messages.len(), 1);
    // Devices and databases cannot look into mailboxes.
    forbidden(
        t.phone2
            .folder(&id("phone-1"), Folder::Messages)
            .await
            .map(drop),
    );
    forbidden(t.db_b.folder(&id("db-a"), Folder::Log).await.map(drop));
    server.stop().await.unwrap();
}

both_stores!(the_retention_timer_sweeps_while_serving);
async fn the_retention_timer_sweeps_while_serving(store: Store) {
    // Retention zero: everything in Log is expired at the next sweep, which
    // comes every 50 ms here instead of daily.
    let http = estafeta_server::HttpSettings {
        retention_interval: std::time::Duration::from_millis(50),
        ..Default::default()
    };
    let server =
        TestServer::start_custom(store, http, |c| c.retention = std::time::Duration::ZERO).await;
    let t = Tenancy::provision(&server.admin).await;
    for n in 0..2 {
        t.phone1
            .send(&message("db-a", &n.to_string(), None))
            .await
            .unwrap();
    }
    let started = t.db_a.start(&start_request("db-a")).await.unwrap();
    let pid = started.process_id.unwrap();
    let first = started.messages.unwrap()[0].id;
    t.db_a.accept(&pid, &[first]).await.unwrap();
    let prepare = PrepareRequest {
        version: Version,
        results: vec![processed(first)],
        replies: vec![],
    };
    t.db_a.prepare(&pid, &prepare).await.unwrap();
    assert_eq!(t.db_a.commit(&pid).await.unwrap().status, CallStatus::Ok);

    let mut swept = false;
    for _ in 0..1000 {
        if server
            .admin
            .folder(&id("db-a"), Folder::Log)
            .await
            .unwrap()
            .files
            .is_empty()
        {
            swept = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(swept, "the processed message was never swept from Log");
    let stats = server.admin.stats().await.unwrap();
    let db_a = stats.databases.iter().find(|d| d.id == id("db-a")).unwrap();
    assert_eq!(db_a.processed, 1);
    // The queue is not subject to retention.
    let queue = server
        .admin
        .folder(&id("db-a"), Folder::Messages)
        .await
        .unwrap();
    assert_eq!(queue.files.len(), 1);
    server.stop().await.unwrap();
}
