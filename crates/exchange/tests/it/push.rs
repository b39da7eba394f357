//! Push hand-off: the exchange tells its [`PushSink`] about a recipient
//! with a webhook once a message for it is in its `Messages` folder (an
//! upload, a committed reply), never about one without; the webhook is
//! kept by the registry across a restart (where recipients with messages
//! still waiting are pushed again), one kept in a session record by an
//! earlier version is moved there, and the admin call that sets it refuses
//! what is not an admin or not a good URL.

use crate::common::{id, message_files, send_request};
use crate::world::{World, write_old_record};
use estafeta_exchange::mailbox::Folder;
use estafeta_exchange::wire::{CallStatus, ErrorCode, ResultStatus, SendMessage};
use estafeta_exchange::{ErrorKind, Id, PushSink, RecipientKind, Sinks};
use estafeta_session::Timestamp as SessionTime;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Records each arrival with the number of files its recipient's
/// `Messages` held at that moment (the message must be there already).
struct Recorder {
    data: PathBuf,
    seen: Mutex<Vec<(String, RecipientKind, usize)>>,
}

impl Recorder {
    fn new(data: &Path) -> Arc<Recorder> {
        Arc::new(Recorder {
            data: data.to_path_buf(),
            seen: Mutex::new(Vec::new()),
        })
    }

    /// Sinks that make a recorder on the data folder, kept in `slot`.
    fn sinks(slot: &mut Option<Arc<Recorder>>) -> impl FnOnce(&Path) -> Sinks + '_ {
        |data| {
            let r = Recorder::new(data);
            *slot = Some(r.clone());
            Sinks {
                push: r,
                ..Sinks::default()
            }
        }
    }

    fn take(&self) -> Vec<(String, RecipientKind, usize)> {
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

impl PushSink for Recorder {
    fn arrived(&self, recipient: &Id, kind: RecipientKind) {
        let files = message_files(&self.data.join(recipient.as_str()).join("Messages"));
        self.seen
            .lock()
            .unwrap()
            .push((recipient.to_string(), kind, files));
    }
}

/// An upload of `{}` to `db`, without a key.
fn upload_to(db: &str) -> SendMessage {
    send_request(db, "{}", None)
}

#[tokio::test(start_paused = true)]
async fn arrivals_for_recipients_with_a_webhook_reach_the_sink_after_the_file() {
    let mut rec = None;
    let w = World::with_sinks(Recorder::sinks(&mut rec)).await;
    let rec = rec.unwrap();
    let url = Some("http://127.0.0.1:9/hook".to_owned());
    for (kind, who) in [
        (RecipientKind::Database, "db-a"),
        (RecipientKind::Device, "phone-1"),
    ] {
        let stored =
            w.ex.set_webhook(&w.admin, kind, id(who), url.clone())
                .await
                .unwrap();
        assert_eq!(stored, url);
        assert_eq!(w.ex.webhook(&id(who)), Some((kind, url.clone().unwrap())));
    }

    w.upload(1).await;
    assert_eq!(
        rec.take(),
        vec![("db-a".into(), RecipientKind::Database, 1)]
    );
    w.ex.send(&w.phone, upload_to("db-b")).await.unwrap();
    assert!(rec.take().is_empty(), "db-b has no webhook");

    let start = w.start().await;
    let pid = start.process_id.unwrap().to_string();
    let results = World::results(&start, ResultStatus::Processed);
    assert_eq!(w.prepare(&pid, results, 2).await, CallStatus::Ok);
    assert!(
        rec.take().is_empty(),
        "replies in Prepared are not arrivals"
    );
    assert_eq!(w.commit(&pid).await, CallStatus::Ok);
    assert_eq!(
        rec.take(),
        vec![("phone-1".into(), RecipientKind::Device, 2)],
        "one call for both replies"
    );
    assert_eq!(w.files("phone-1", Folder::Messages), 2);

    // Kept in the sessions: after a restart the webhooks are known again.
    let mut rec = None;
    let w = w
        .restart_with(SessionTime(1_800_000_100_000), Recorder::sinks(&mut rec))
        .await;
    let rec = rec.unwrap();
    w.ex.tidy().await.unwrap();
    assert_eq!(
        w.ex.webhook(&id("db-a")).map(|(k, _)| k),
        Some(RecipientKind::Database)
    );
    assert_eq!(
        rec.take(),
        vec![("phone-1".into(), RecipientKind::Device, 2)],
        "the start-up work after ready announces the replies still waiting"
    );
    w.upload(1).await;
    assert_eq!(
        rec.take(),
        vec![("db-a".into(), RecipientKind::Database, 1)]
    );

    // Cleared: no more arrivals.
    assert_eq!(
        w.ex.set_webhook(&w.admin, RecipientKind::Database, id("db-a"), None)
            .await
            .unwrap(),
        None
    );
    assert_eq!(w.ex.webhook(&id("db-a")), None);
    w.upload(1).await;
    assert!(rec.take().is_empty());
}

#[tokio::test(start_paused = true)]
async fn setting_a_webhook_needs_the_admin_a_known_recipient_and_a_good_url() {
    let w = World::new().await;
    let good = Some("https://hooks.example.org/x".to_owned());
    let kind_of =
        |r: Result<Option<String>, estafeta_exchange::ExchangeError>| r.unwrap_err().kind();
    for who in [&w.db, &w.phone] {
        let r =
            w.ex.set_webhook(who, RecipientKind::Database, id("db-a"), good.clone())
                .await;
        assert_eq!(kind_of(r), ErrorKind::Forbidden);
    }
    for (kind, who) in [
        (RecipientKind::Database, "nope"),
        (RecipientKind::Database, "phone-1"),
        (RecipientKind::Device, "db-a"),
    ] {
        let r =
            w.ex.set_webhook(&w.admin, kind, id(who), good.clone())
                .await;
        assert_eq!(kind_of(r), ErrorKind::NotFound, "{who}");
    }
    let bad =
        w.ex.set_webhook(
            &w.admin,
            RecipientKind::Database,
            id("db-a"),
            Some("mailto:ops@example.org".into()),
        )
        .await;
    let e = bad.unwrap_err();
    assert_eq!(
        (e.kind(), e.code()),
        (ErrorKind::BadRequest, ErrorCode::BadWebhookUrl)
    );
    assert_eq!(
        w.ex.webhook(&id("db-a")),
        None,
        "a refused call changes nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn after_a_restart_recipients_with_waiting_messages_are_pushed_again() {
    let w = World::new().await;
    let url = Some("http://127.0.0.1:9/hook".to_owned());
    for (kind, who) in [
        (RecipientKind::Database, "db-a"),
        (RecipientKind::Database, "db-b"),
        (RecipientKind::Device, "phone-1"),
    ] {
        w.ex.set_webhook(&w.admin, kind, id(who), url.clone())
            .await
            .unwrap();
    }
    w.upload(2).await;

    // The pushes of those arrivals may not have been scheduled durably
    // before the stop: the start-up work after ready announces what waits.
    let mut rec = None;
    let w = w
        .restart_with(SessionTime(1_800_000_100_000), Recorder::sinks(&mut rec))
        .await;
    let rec = rec.unwrap();
    assert!(rec.take().is_empty(), "announced by the work after ready");
    w.ex.tidy().await.unwrap();
    assert_eq!(
        rec.take(),
        vec![("db-a".into(), RecipientKind::Database, 2)],
        "db-b and phone-1 have nothing waiting"
    );
}

#[tokio::test(start_paused = true)]
async fn webhooks_an_earlier_version_kept_in_session_records_move_into_the_registry() {
    let w = World::new().await;
    // db-a's webhook is set through the admin API; its record also holds
    // an older one, which must not replace it.
    w.ex.set_webhook(
        &w.admin,
        RecipientKind::Database,
        id("db-a"),
        Some("http://127.0.0.1:9/new".into()),
    )
    .await
    .unwrap();
    let mut rec = None;
    let w = w
        .restart_with(SessionTime(1_800_000_100_000), |data| {
            for (key, url) in [
                (&b"dev/phone-2"[..], "http://127.0.0.1:9/dev"),
                (b"db/db-b", "http://127.0.0.1:9/db"),
                (b"db/db-a", "http://127.0.0.1:9/old"),
            ] {
                write_old_record(data, key, &format!(r#"{{"webhook":"{url}"}}"#), 1);
            }
            Recorder::sinks(&mut rec)(data)
        })
        .await;
    let rec = rec.unwrap();
    assert_eq!(w.ex.tidy().await.unwrap().webhooks_moved, 3);
    let hook = |who: &str| w.ex.webhook(&id(who)).map(|(_, url)| url);
    assert_eq!(hook("phone-2").as_deref(), Some("http://127.0.0.1:9/dev"));
    assert_eq!(hook("db-b").as_deref(), Some("http://127.0.0.1:9/db"));
    assert_eq!(hook("db-a").as_deref(), Some("http://127.0.0.1:9/new"));
    rec.take();
    w.ex.send(&w.phone, upload_to("db-b")).await.unwrap();
    assert_eq!(
        rec.take(),
        vec![("db-b".into(), RecipientKind::Database, 1)],
        "pushed to the moved webhook"
    );

    // Moved once: the records no longer hold them, the registry does.
    let w = w.restart(SessionTime(1_800_000_200_000)).await;
    assert_eq!(w.ex.tidy().await.unwrap().webhooks_moved, 0);
    assert_eq!(
        w.ex.webhook(&id("phone-2")).map(|(_, url)| url).as_deref(),
        Some("http://127.0.0.1:9/dev")
    );
}
