//! E-mail through a real SMTP dialogue with a server on loopback started by
//! the test: plain, with AUTH, and with STARTTLS on a self-signed certificate.

mod common;

use std::time::Duration;

use common::smtp_server::{self, Options};
use estafeta_sendq::{
    EmailMessage, Kind, QueueConfig, SendError, SendQueue, SmtpConfig, SmtpCredentials,
    SmtpSecurity, SmtpTransport, TransportError, TypeConfig,
};

fn config(port: u16, security: SmtpSecurity, login: Option<(&str, &str)>) -> SmtpConfig {
    SmtpConfig {
        host: "localhost".into(),
        port,
        security,
        credentials: login.map(|(u, p)| SmtpCredentials {
            username: u.into(),
            password: p.into(),
        }),
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

fn queue(transport: SmtpTransport) -> SendQueue<&'static str, EmailMessage, SmtpTransport> {
    SendQueue::new(
        QueueConfig::new(vec![TypeConfig::new("mail", 2)]),
        transport,
    )
    .unwrap()
}

#[tokio::test]
async fn a_message_arrives_with_its_recipients_subject_and_body() {
    let mut server = smtp_server::start(Options::default()).await;
    let transport =
        SmtpTransport::new(&config(server.addr.port(), SmtpSecurity::None, None)).unwrap();
    let q = queue(transport);
    let answer = q.submit("relay", Kind(0), alert()).unwrap().await.unwrap();
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
    };
    let mut server = smtp_server::start(options).await;
    let port = server.addr.port();
    let good = queue(
        SmtpTransport::new(&config(port, SmtpSecurity::None, Some(("ops", "s3cret")))).unwrap(),
    );
    good.submit("relay", Kind(0), alert())
        .unwrap()
        .await
        .unwrap();
    let got = server.received.recv().await.unwrap();
    assert_eq!(got.user.as_deref(), Some("ops"));
    good.shutdown().await;

    let bad = queue(
        SmtpTransport::new(&config(port, SmtpSecurity::None, Some(("ops", "wrong")))).unwrap(),
    );
    let refused = bad.submit("relay", Kind(0), alert()).unwrap().await;
    assert!(
        matches!(refused, Err(SendError::Transport(TransportError::Smtp(_)))),
        "{refused:?}"
    );
    bad.shutdown().await;

    let anonymous = queue(SmtpTransport::new(&config(port, SmtpSecurity::None, None)).unwrap());
    let refused = anonymous.submit("relay", Kind(0), alert()).unwrap().await;
    assert!(
        matches!(refused, Err(SendError::Transport(TransportError::Smtp(_)))),
        "{refused:?}"
    );
    anonymous.shutdown().await;
    assert!(
        server.received.try_recv().is_err(),
        "nothing else was delivered"
    );
}

#[tokio::test]
async fn starttls_with_a_self_signed_root_and_authentication() {
    let (acceptor, root_pem) = smtp_server::self_signed_localhost();
    let options = Options {
        login: Some(("ops".into(), "s3cret".into())),
        tls: Some(acceptor),
    };
    let mut server = smtp_server::start(options).await;
    let security = SmtpSecurity::StartTls {
        root_certificate_pem: Some(root_pem),
    };
    let transport = SmtpTransport::new(&config(
        server.addr.port(),
        security,
        Some(("ops", "s3cret")),
    ))
    .unwrap();
    let q = queue(transport);
    q.submit("relay", Kind(0), alert()).unwrap().await.unwrap();
    let got = server.received.recv().await.unwrap();
    assert!(got.tls, "delivered under TLS");
    assert_eq!(got.user.as_deref(), Some("ops"));
    assert!(got.data.contains("Subject: Process in doubt\r\n"));
    q.shutdown().await;
}

#[tokio::test]
async fn starttls_refuses_a_certificate_it_does_not_trust() {
    let (acceptor, _) = smtp_server::self_signed_localhost();
    let (_, other_root) = smtp_server::self_signed_localhost();
    let options = Options {
        login: None,
        tls: Some(acceptor),
    };
    let mut server = smtp_server::start(options).await;
    let security = SmtpSecurity::StartTls {
        root_certificate_pem: Some(other_root),
    };
    let q = queue(SmtpTransport::new(&config(server.addr.port(), security, None)).unwrap());
    let refused = q.submit("relay", Kind(0), alert()).unwrap().await;
    assert!(
        matches!(refused, Err(SendError::Transport(TransportError::Smtp(_)))),
        "{refused:?}"
    );
    assert!(server.received.try_recv().is_err());
    q.shutdown().await;
}

#[tokio::test]
async fn bad_addresses_are_configuration_errors() {
    let bad_from = SmtpConfig {
        from: "not an address".into(),
        ..config(25, SmtpSecurity::None, None)
    };
    assert!(SmtpTransport::new(&bad_from).is_err());
    let server = smtp_server::start(Options::default()).await;
    let q =
        queue(SmtpTransport::new(&config(server.addr.port(), SmtpSecurity::None, None)).unwrap());
    let mut email = alert();
    email.to = vec!["nobody".into()];
    let refused = q.submit("relay", Kind(0), email).unwrap().await;
    assert!(matches!(refused, Err(SendError::Config(_))), "{refused:?}");
    q.shutdown().await;
}
