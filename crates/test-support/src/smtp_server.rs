//! A minimal SMTP server on loopback that speaks the real protocol (EHLO,
//! STARTTLS, AUTH PLAIN and LOGIN, MAIL, RCPT, DATA, RSET, NOOP, QUIT) and
//! hands every accepted message to the test.

use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::{self, pki_types};

/// A message as the server accepted it.
#[derive(Debug, Clone)]
pub struct Received {
    /// The user name that logged in, if any.
    pub user: Option<String>,
    /// Whether the session was under TLS (after STARTTLS).
    pub tls: bool,
    /// The envelope's sender (MAIL FROM), without its angle brackets.
    pub from: String,
    /// The envelope's recipients (RCPT TO), in the order given.
    pub to: Vec<String>,
    /// The DATA section, dot-unstuffed.
    pub data: String,
}

/// What the server demands.
#[derive(Clone, Default)]
pub struct Options {
    /// Require AUTH with this user name and password before MAIL.
    pub login: Option<(String, String)>,
    /// Offer STARTTLS with this acceptor, and require it before AUTH and MAIL.
    pub tls: Option<TlsAcceptor>,
    /// With `tls`: TLS from the first byte (smtps) instead of STARTTLS.
    pub implicit: bool,
}

/// A running server: its address and the messages it accepted.
pub struct SmtpServer {
    /// Where it listens (127.0.0.1, a port of its own).
    pub addr: SocketAddr,
    /// Each message it accepted, as it accepted it.
    pub received: mpsc::UnboundedReceiver<Received>,
}

/// A self-signed certificate for `localhost`: the acceptor and the PEM root
/// for the client to trust.
pub fn self_signed_localhost() -> (TlsAcceptor, String) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let pem = cert.cert.pem();
    let key = pki_types::PrivateKeyDer::Pkcs8(pki_types::PrivatePkcs8KeyDer::from(
        cert.signing_key.serialize_der(),
    ));
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    (TlsAcceptor::from(Arc::new(config)), pem)
}

/// Starts the server on a port-0 loopback listener.
pub async fn start(options: Options) -> SmtpServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let options = Arc::new(options);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (options, tx) = (Arc::clone(&options), tx.clone());
            tokio::spawn(async move { serve(stream, options, tx).await });
        }
    });
    SmtpServer { addr, received: rx }
}

async fn serve(mut stream: TcpStream, options: Arc<Options>, tx: mpsc::UnboundedSender<Received>) {
    if let (true, Some(acceptor)) = (options.implicit, options.tls.clone()) {
        let Ok(mut tls) = acceptor.accept(stream).await else {
            return;
        };
        if tls.write_all(b"220 localhost ESMTP test\r\n").await.is_ok() {
            session(tls, &options, true, &tx).await;
        }
        return;
    }
    if stream
        .write_all(b"220 localhost ESMTP test\r\n")
        .await
        .is_err()
    {
        return;
    }
    let Some(stream) = session(stream, &options, false, &tx).await else {
        return;
    };
    let Some(acceptor) = options.tls.clone() else {
        return;
    };
    if let Ok(tls) = acceptor.accept(stream).await {
        session(tls, &options, true, &tx).await;
    }
}

/// Runs one session; returns the stream if the client asked for STARTTLS.
async fn session<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    options: &Options,
    tls: bool,
    tx: &mpsc::UnboundedSender<Received>,
) -> Option<S> {
    let mut io = BufReader::new(stream);
    let mut user: Option<String> = None;
    let mut from = String::new();
    let mut to = Vec::new();
    let needs_tls = options.tls.is_some() && !tls;
    loop {
        let line = read_line(&mut io).await?;
        let upper = line.to_ascii_uppercase();
        let reply: String = if upper.starts_with("EHLO") {
            let mut r = String::from("250-localhost\r\n");
            if needs_tls {
                r.push_str("250-STARTTLS\r\n");
            } else if options.login.is_some() {
                r.push_str("250-AUTH PLAIN LOGIN\r\n");
            }
            r.push_str("250 8BITMIME\r\n");
            r
        } else if upper.starts_with("HELO") || upper.starts_with("NOOP") {
            "250 OK\r\n".into()
        } else if upper.starts_with("STARTTLS") && needs_tls {
            io.write_all(b"220 ready to start TLS\r\n").await.ok()?;
            return Some(io.into_inner());
        } else if upper.starts_with("AUTH") && !needs_tls {
            let (name, pass) = auth(&mut io, &line).await?;
            match &options.login {
                Some((u, p)) if *u == name && *p == pass => {
                    user = Some(name);
                    "235 2.7.0 Authentication successful\r\n".into()
                }
                _ => "535 5.7.8 Authentication credentials invalid\r\n".into(),
            }
        } else if upper.starts_with("MAIL FROM:") {
            if needs_tls {
                "530 5.7.0 Must issue a STARTTLS command first\r\n".into()
            } else if options.login.is_some() && user.is_none() {
                "530 5.7.0 Authentication required\r\n".into()
            } else {
                from = address(&line);
                to.clear();
                "250 OK\r\n".into()
            }
        } else if upper.starts_with("RCPT TO:") {
            to.push(address(&line));
            "250 OK\r\n".into()
        } else if upper.starts_with("DATA") {
            io.write_all(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                .await
                .ok()?;
            let mut data = String::new();
            loop {
                let l = read_line(&mut io).await?;
                if l == "." {
                    break;
                }
                data.push_str(l.strip_prefix('.').unwrap_or(&l));
                data.push_str("\r\n");
            }
            let _ = tx.send(Received {
                user: user.clone(),
                tls,
                from: from.clone(),
                to: std::mem::take(&mut to),
                data,
            });
            "250 2.0.0 OK queued\r\n".into()
        } else if upper.starts_with("RSET") {
            to.clear();
            "250 OK\r\n".into()
        } else if upper.starts_with("QUIT") {
            let _ = io.write_all(b"221 Bye\r\n").await;
            return None;
        } else {
            "502 5.5.2 Command not recognized\r\n".into()
        };
        io.write_all(reply.as_bytes()).await.ok()?;
    }
}

async fn read_line<S: AsyncRead + AsyncWrite + Unpin>(io: &mut BufReader<S>) -> Option<String> {
    let mut line = String::new();
    if io.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    Some(line.trim_end_matches(['\r', '\n']).to_owned())
}

fn address(line: &str) -> String {
    let start = line.find('<').map_or(0, |i| i + 1);
    let end = line.rfind('>').unwrap_or(line.len());
    line[start..end].to_owned()
}

fn decode(b64: &str) -> String {
    String::from_utf8(B64.decode(b64.trim()).unwrap_or_default()).unwrap_or_default()
}

/// Reads an AUTH PLAIN or LOGIN exchange; returns the user name and password.
async fn auth<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut BufReader<S>,
    line: &str,
) -> Option<(String, String)> {
    let mut words = line.split_whitespace().skip(1);
    let mechanism = words.next()?.to_ascii_uppercase();
    let initial = words.next().map(str::to_owned);
    match mechanism.as_str() {
        "PLAIN" => {
            let response = match initial {
                Some(r) => r,
                None => {
                    io.write_all(b"334 \r\n").await.ok()?;
                    read_line(io).await?
                }
            };
            let decoded = decode(&response);
            let mut parts = decoded.split('\0').skip(1);
            Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
        }
        "LOGIN" => {
            let name = match initial {
                Some(r) => decode(&r),
                None => {
                    io.write_all(b"334 VXNlcm5hbWU6\r\n").await.ok()?;
                    decode(&read_line(io).await?)
                }
            };
            io.write_all(b"334 UGFzc3dvcmQ6\r\n").await.ok()?;
            let pass = decode(&read_line(io).await?);
            Some((name, pass))
        }
        _ => None,
    }
}
