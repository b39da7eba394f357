//! E-mail through a real SMTP dialogue with a server on loopback started by
//! the test: plain, with AUTH, and with STARTTLS on a self-signed certificate.

use std::time::Duration;

use estafeta_sendq::{
    EmailMessage, Kind, QueueConfig, SendError, SendQueue, SmtpAnswer, SmtpConfig, SmtpTransport,
    TransportError, TypeConfig,
};
use estafeta_test_support::smtp_server::{self, Options, SmtpServer};

/// The relay `url`, trusting `root` (PEM) for TLS.
fn config(url: String, root: Option<String>) -> SmtpConfig {
    SmtpConfig {
        url,
        root_certificate_pem: root,
        from: "Estafeta <alerts@estafeta.test>".into(),
        timeout: Duration::from_secs(10),
    }
}

fn alert() -> EmailMessage {
    EmailMessage {
        to: vec!["ops@example.test".into(), "oncall@example.test".into()],
        subject: "Process in doubt".into(),
        body: "Database 42: process 7 is in doubt.\n.leading dot line\n".into(),
    }
}

/// A queue over a transport to the relay `url`, trusting `root` (PEM).
fn queue(
    url: String,
    root: Option<String>,
) -> SendQueue<&'static str, EmailMessage, SmtpTransport> {
    let transport = SmtpTransport::new(&config(url, root)).unwrap();
    SendQueue::new(
        QueueConfig::new(vec![TypeConfig::new("mail", 2)]),
        transport,
    )
    .unwrap()
}

/// Sends [`alert`] through `q`.
async fn send_alert(
    q: &SendQueue<&'static str, EmailMessage, SmtpTransport>,
) -> Result<SmtpAnswer, SendError> {
    q.submit("relay", Kind(0), alert()).unwrap().await
}

/// Sends [`alert`] through `q` and asserts that the SMTP dialogue fails.
async fn assert_smtp_refused(q: &SendQueue<&'static str, EmailMessage, SmtpTransport>) {
    let refused = send_alert(q).await;
    assert!(
        matches!(refused, Err(SendError::Transport(TransportError::Smtp(_)))),
        "{refused:?}"
    );
}

/// A relay on loopback with TLS on a self-signed certificate for localhost
/// (implicit TLS if `implicit`, STARTTLS otherwise), asking for `login` if
/// given; and the certificate's root (PEM).
async fn tls_relay(login: Option<(&str, &str)>, implicit: bool) -> (SmtpServer, String) {
    let (acceptor, root_pem) = smtp_server::self_signed_localhost();
    let options = Options {
        login: login.map(|(user, password)| (user.into(), password.into())),
        tls: Some(acceptor),
        implicit,
    };
    (smtp_server::start(options).await, root_pem)
}

#[tokio::test]
async fn a_message_arrives_with_its_recipients_subject_and_body() {
    let mut server = smtp_server::start(Options::default()).await;
    let q = queue(format!("smtp://localhost:{}", server.addr.port()), None);
    let answer = send_alert(&q).await.unwrap();
    assert_eq!(answer.code, "250");

    let got = server.received.recv().await.unwrap();
    assert_eq!(got.from, "alerts@estafeta.test");
    assert_eq!(got.to, vec!["ops@example.test", "oncall@example.test"]);
    assert!(
        got.data.contains("Subject: Process in doubt\r\n"),
        "{}",
        got.data
    );
    assert!(
        got.data.contains("Database 42: process 7 is in doubt.\r\n"),
        "{}",
        got.data
    );
    assert!(
        got.data.contains("\r\n.leading dot line\r\n"),
        "dot-stuffing undone: {}",
        got.data
    );
    assert_eq!((got.user, got.tls), (None, false));
    q.shutdown().await;
}

#[tokio::test]
async fn authentication_is_used_when_configured() {
    let options = Options {
        login: Some(("ops".into(), "s3cret".into())),
        tls: None,
        implicit: false,
    };
    let mut server = smtp_server::start(options).await;
    let port = server.addr.port();
    let good = queue(format!("smtp://ops:s3cret@localhost:{port}"), None);
    send_alert(&good).await.unwrap();
    let got = server.received.recv().await.unwrap();
    assert_eq!(got.user.as_deref(), Some("ops"));
    good.shutdown().await;

    let bad = queue(format!("smtp://ops:wrong@localhost:{port}"), None);
    assert_smtp_refused(&bad).await;
    bad.shutdown().await;

    let anonymous = queue(format!("smtp://localhost:{port}"), None);
    assert_smtp_refused(&anonymous).await;
    anonymous.shutdown().await;
    assert!(
        server.received.try_recv().is_err(),
        "nothing else was delivered"
    );
}

#[tokio::test]
async fn starttls_with_a_self_signed_root_and_authentication() {
    let (mut server, root_pem) = tls_relay(Some(("ops", "s3cret")), false).await;
    let url = format!(
        "smtp://ops:s3cret@localhost:{}?tls=required",
        server.addr.port()
    );
    let q = queue(url, Some(root_pem));
    send_alert(&q).await.unwrap();
    let got = server.received.recv().await.unwrap();
    assert!(got.tls, "delivered under TLS");
    assert_eq!(got.user.as_deref(), Some("ops"));
    assert!(got.data.contains("Subject: Process in doubt\r\n"));
    q.shutdown().await;
}

#[tokio::test]
async fn starttls_refuses_a_certificate_it_does_not_trust() {
    let (mut server, _) = tls_relay(None, false).await;
    let (_, other_root) = smtp_server::self_signed_localhost();
    let url = format!("smtp://localhost:{}?tls=required", server.addr.port());
    let q = queue(url, Some(other_root));
    assert_smtp_refused(&q).await;
    assert!(server.received.try_recv().is_err());
    q.shutdown().await;
}

#[tokio::test]
async fn bad_addresses_are_configuration_errors() {
    let bad_from = SmtpConfig {
        from: "not an address".into(),
        ..config("smtp://localhost".into(), None)
    };
    assert!(SmtpTransport::new(&bad_from).is_err());
    let server = smtp_server::start(Options::default()).await;
    let q = queue(format!("smtp://localhost:{}", server.addr.port()), None);
    let mut email = alert();
    email.to = vec!["nobody".into()];
    let refused = q.submit("relay", Kind(0), email).unwrap().await;
    assert!(matches!(refused, Err(SendError::Config(_))), "{refused:?}");
    q.shutdown().await;
}

#[tokio::test]
async fn opportunistic_tls_upgrades_when_the_relay_offers_it() {
    let (mut server, root_pem) = tls_relay(None, false).await;
    let url = format!("smtp://localhost:{}?tls=opportunistic", server.addr.port());
    let q = queue(url, Some(root_pem));
    send_alert(&q).await.unwrap();
    assert!(server.received.recv().await.unwrap().tls);
    q.shutdown().await;

    // A relay without STARTTLS gets the message in plain text.
    let mut plain = smtp_server::start(Options::default()).await;
    let url = format!("smtp://localhost:{}?tls=opportunistic", plain.addr.port());
    let q = queue(url, None);
    send_alert(&q).await.unwrap();
    assert!(!plain.received.recv().await.unwrap().tls);
    q.shutdown().await;
}

#[tokio::test]
async fn smtps_speaks_tls_from_the_first_byte() {
    let (mut server, root_pem) = tls_relay(Some(("ops", "s3cret")), true).await;
    let url = format!("smtps://ops:s3cret@localhost:{}", server.addr.port());
    let q = queue(url, Some(root_pem));
    send_alert(&q).await.unwrap();
    let got = server.received.recv().await.unwrap();
    assert!(got.tls);
    assert_eq!(got.user.as_deref(), Some("ops"));
    q.shutdown().await;
}

#[test]
fn bad_smtp_urls_are_refused_without_showing_the_password() {
    for url in [
        "http://ops:pa55word@mail.example.org",
        "smtp://ops:pa55word@mail.example.org?starttls=on",
        "smtp://ops:pa55word@mail.example.org?tls=maybe",
        "smtp://ops:pa55word@:25",
        "not a url",
    ] {
        let refused = SmtpTransport::new(&config(url.into(), None)).unwrap_err();
        let text = refused.to_string();
        assert!(text.contains("SMTP URL"), "{url}: {text}");
        assert!(!text.contains("pa55word"), "{url}: {text}");
    }
    let starttls = SmtpTransport::new(&config("smtp://h?starttls=on".into(), None)).unwrap_err();
    assert!(starttls.to_string().contains("tls=required"), "{starttls}");
    let good = config("smtps://ops:pa55word@mail.example.org".into(), None);
    SmtpTransport::new(&good).unwrap();
    assert!(!format!("{good:?}").contains("pa55word"));
}
