//! TLS to PostgreSQL, with libpq's meaning of the store URL's `ssl*`
//! settings.
//!
//! Operators write the store URL as they write it for `psql`: `sslmode`
//! one of `disable`, `allow`, `prefer` (the default), `require`,
//! `verify-ca` or `verify-full`, a root certificate in `sslrootcert` (a PEM
//! file, or `system` for the machine's trusted roots), and a client
//! certificate in `sslcert` and `sslkey`. tokio-postgres itself knows only
//! `disable`, `prefer` and `require`, and checks no certificate: this module
//! takes these settings out of the URL, hands tokio-postgres the rest, and
//! builds the rustls configuration that checks what libpq would check:
//!
//! - `disable`: no TLS. `allow` and `prefer`: TLS when the server offers it,
//!   its certificate unchecked. `require`: TLS or no connection, the
//!   certificate unchecked, unless a root certificate is given (then as
//!   `verify-ca`, as libpq does).
//! - `verify-ca`: the server's certificate must chain to the root.
//! - `verify-full`: and must name the host the URL connects to (`host`,
//!   even when `hostaddr` gives the address).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::Error;

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// No TLS.
    Disable,
    /// TLS if the server offers it (libpq's `allow` and `prefer`; `allow`
    /// tries plain first, which ends in the same place).
    Prefer,
    /// TLS, no check of the certificate.
    Require,
    /// TLS, the certificate chained to the root.
    VerifyCa,
    /// TLS, the certificate chained to the root and naming the host.
    VerifyFull,
}

impl Mode {
    fn parse(value: &str) -> Result<Mode, Error> {
        Ok(match value {
            "disable" => Mode::Disable,
            "allow" | "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            other => {
                return Err(Error::Tls(format!(
                    "sslmode `{other}` is none of disable, allow, prefer, require, verify-ca, verify-full"
                )));
            }
        })
    }

    /// What tokio-postgres is told: whether TLS is tried, and whether it
    /// must succeed.
    fn ssl_mode(self) -> SslMode {
        match self {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }
}

/// The TLS settings read out of a store URL.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    /// `sslmode` (libpq's default: `prefer`).
    pub(crate) mode: Mode,
    /// `sslrootcert`: a PEM file, or `system`.
    root_cert: Option<String>,
    /// `sslcert`: the client's certificate chain (PEM), for servers that
    /// authenticate clients by certificate.
    client_cert: Option<PathBuf>,
    /// `sslkey`: the client certificate's private key (PEM).
    client_key: Option<PathBuf>,
}

impl Settings {
    /// Split `url` (a `postgres://` URL or a libpq `key=value` string) into
    /// the URL tokio-postgres is given and the TLS settings taken out of it.
    pub(crate) fn take_from(url: &str) -> Result<(String, Settings), Error> {
        let mut settings = Settings {
            mode: Mode::Prefer,
            root_cert: None,
            client_cert: None,
            client_key: None,
        };
        let mut take = |key: &str, value: String| -> Result<bool, Error> {
            match key {
                "sslmode" => settings.mode = Mode::parse(&value)?,
                "sslrootcert" => settings.root_cert = Some(value),
                "sslcert" => settings.client_cert = Some(value.into()),
                "sslkey" => settings.client_key = Some(value.into()),
                _ => return Ok(false),
            }
            Ok(true)
        };
        let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            take_from_query(url, &mut take)?
        } else {
            take_from_pairs(url, &mut take)?
        };
        Ok((rest, settings))
    }

    /// The mode tokio-postgres connects in.
    pub(crate) fn ssl_mode(&self) -> SslMode {
        self.mode.ssl_mode()
    }

    /// The connector that does the TLS handshake and checks the server's
    /// certificate as the mode says. Reads the certificate files now, so a
    /// wrong path stops a node at start, not at its first connection.
    pub(crate) fn connector(&self) -> Result<MakeRustlsConnect, Error> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::Tls(e.to_string()))?;
        let check = match (self.mode, &self.root_cert) {
            (Mode::Disable | Mode::Prefer, _) | (Mode::Require, None) => Check::Nothing,
            (Mode::Require | Mode::VerifyCa, _) => Check::Chain,
            (Mode::VerifyFull, _) => Check::Full,
        };
        let builder = match check {
            Check::Nothing => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Lenient {
                    provider,
                    chain: None,
                })),
            Check::Chain | Check::Full => {
                let roots = Arc::new(self.roots()?);
                let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| Error::Tls(format!("root certificates: {e}")))?;
                if check == Check::Chain {
                    builder
                        .dangerous()
                        .with_custom_certificate_verifier(Arc::new(Lenient {
                            provider,
                            chain: Some(webpki),
                        }))
                } else {
                    builder.with_webpki_verifier(webpki)
                }
            }
        };
        let config = match (&self.client_cert, &self.client_key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                    .map_err(|e| file_error("sslcert", cert, e))?;
                let key =
                    PrivateKeyDer::from_pem_file(key).map_err(|e| file_error("sslkey", key, e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| Error::Tls(format!("sslcert and sslkey: {e}")))?
            }
            _ => {
                return Err(Error::Tls(
                    "sslcert and sslkey go together: give both or neither".into(),
                ));
            }
        };
        Ok(MakeRustlsConnect::new(config))
    }

    /// The trusted roots: `sslrootcert`'s file, the system's for `system`,
    /// and libpq's default file `~/.postgresql/root.crt` when none is named.
    fn roots(&self) -> Result<RootCertStore, Error> {
        let mut roots = RootCertStore::empty();
        let path = match self.root_cert.as_deref() {
            Some("system") => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(Error::Tls(
                        "sslrootcert=system: the system has no trusted root certificates".into(),
                    ));
                }
                return Ok(roots);
            }
            Some(path) => PathBuf::from(path),
            None => std::env::home_dir()
                .map(|home| home.join(".postgresql/root.crt"))
                .filter(|path| path.exists())
                .ok_or_else(|| {
                    Error::Tls(format!(
                        "sslmode={} checks the server's certificate: name its root in \
                         sslrootcert (a PEM file, or `system`)",
                        if self.mode == Mode::VerifyFull {
                            "verify-full"
                        } else {
                            "verify-ca"
                        }
                    ))
                })?,
        };
        let certs = CertificateDer::pem_file_iter(&path)
            .and_then(Iterator::collect::<Result<Vec<_>, _>>)
            .map_err(|e| file_error("sslrootcert", &path, e))?;
        if certs.is_empty() {
            return Err(Error::Tls(format!(
                "sslrootcert {}: no certificate in it",
                path.display()
            )));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| Error::Tls(format!("sslrootcert {}: {e}", path.display())))?;
        }
        Ok(roots)
    }
}

/// How much of the server's certificate is checked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    Nothing,
    Chain,
    Full,
}

fn file_error(setting: &str, path: &Path, error: rustls::pki_types::pem::Error) -> Error {
    Error::Tls(format!("{setting} {}: {error}", path.display()))
}

/// The URL form: `ssl*` parameters taken out of the query string.
fn take_from_query(
    url: &str,
    take: &mut impl FnMut(&str, String) -> Result<bool, Error>,
) -> Result<String, Error> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok(url.to_owned());
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| Error::Tls(format!("`{pair}` is not UTF-8 once decoded")))
        };
        if !take(&decode(key)?, decode(value)?)? {
            kept.push(pair);
        }
    }
    Ok(if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    })
}

/// The `key=value` form: `ssl*` pairs taken out, the others kept as
/// written. Values are bare words or single-quoted, with backslash escapes,
/// and spaces may stand around `=`, as libpq reads them.
fn take_from_pairs(
    text: &str,
    take: &mut impl FnMut(&str, String) -> Result<bool, Error>,
) -> Result<String, Error> {
    let malformed = || Error::Tls(format!("cannot read `{text}` as key=value pairs"));
    let mut kept = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let start = rest;
        let (key, after) = rest.split_once('=').ok_or_else(malformed)?;
        let key = key.trim();
        if key.is_empty() || key.contains(char::is_whitespace) {
            return Err(malformed());
        }
        let after = after.trim_start();
        let mut chars = after.char_indices();
        let quoted = after.starts_with('\'');
        if quoted {
            chars.next();
        }
        let mut value = String::new();
        let mut end = after.len();
        let mut closed = !quoted;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => value.push(chars.next().ok_or_else(malformed)?.1),
                '\'' if quoted => {
                    end = i + 1;
                    closed = true;
                    break;
                }
                c if !quoted && c.is_whitespace() => {
                    end = i;
                    break;
                }
                c => value.push(c),
            }
        }
        if !closed {
            return Err(malformed());
        }
        let consumed = start.len() - after.len() + end;
        if !take(key, value)? {
            kept.push(&start[..consumed]);
        }
        rest = start[consumed..].trim_start();
    }
    Ok(kept.join(" "))
}

/// The checks of `prefer`, `require` and `verify-ca`, which webpki's own
/// verifier (`verify-full`) does not offer: with no `chain`, the server's
/// certificate is taken as shown (libpq's behaviour without a root); with
/// one, it must chain to the root, but may be for another name (webpki
/// checks the chain first, so a name error means the chain held). Either
/// way the handshake's signatures are checked, so the peer holds the
/// certificate's key.
#[derive(Debug)]
struct Lenient {
    provider: Arc<CryptoProvider>,
    chain: Option<Arc<WebPkiServerVerifier>>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(url: &str) -> (String, Settings) {
        Settings::take_from(url).unwrap()
    }

    #[test]
    fn a_url_without_ssl_settings_is_left_alone_and_prefers_tls() {
        let (rest, settings) =
            split("postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write");
        assert_eq!(
            rest,
            "postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write"
        );
        assert_eq!(settings.mode, Mode::Prefer);
        assert_eq!(split("postgres://u@h/db").0, "postgres://u@h/db");
    }

    #[test]
    fn ssl_settings_are_taken_out_of_a_url_query() {
        let (rest, settings) = split(
            "postgresql://u@h/db?sslmode=verify-full&application_name=a&sslrootcert=%2Fetc%2Fca%20x.pem",
        );
        assert_eq!(rest, "postgresql://u@h/db?application_name=a");
        assert_eq!(settings.mode, Mode::VerifyFull);
        assert_eq!(settings.root_cert.as_deref(), Some("/etc/ca x.pem"));
        assert_eq!(settings.ssl_mode(), SslMode::Require);
        let (rest, _) = split("postgres://h/db?sslmode=require");
        assert_eq!(rest, "postgres://h/db");
    }

    #[test]
    fn ssl_settings_are_taken_out_of_key_value_pairs() {
        let (rest, settings) = split(
            "host=h1,h2  port = 5432 sslmode = verify-ca sslrootcert='/etc/my ca\\'s.pem' \
             user=u options='-c a=b' sslcert=/c.pem sslkey=/k.pem",
        );
        assert_eq!(rest, "host=h1,h2 port = 5432 user=u options='-c a=b'");
        assert_eq!(settings.mode, Mode::VerifyCa);
        assert_eq!(settings.root_cert.as_deref(), Some("/etc/my ca's.pem"));
        assert_eq!(settings.client_cert, Some(PathBuf::from("/c.pem")));
        assert_eq!(settings.client_key, Some(PathBuf::from("/k.pem")));
        // What is left is still a string tokio-postgres reads.
        rest.parse::<tokio_postgres::Config>().unwrap();
    }

    #[test]
    fn an_unknown_mode_or_a_broken_string_is_an_error() {
        for url in [
            "postgres://h/db?sslmode=verify",
            "host=h sslmode=strict",
            "host=h sslrootcert='/unclosed",
            "host=h nothing",
        ] {
            assert!(
                matches!(Settings::take_from(url), Err(Error::Tls(_))),
                "{url}"
            );
        }
    }

    #[test]
    fn a_check_without_a_root_or_with_a_missing_file_is_refused_at_start() {
        let (_, settings) = split("host=h sslmode=verify-full sslrootcert=/nonexistent/ca.pem");
        let error = settings
            .connector()
            .err()
            .expect("a missing root file is an error");
        assert!(error.to_string().contains("/nonexistent/ca.pem"), "{error}");
        let (_, settings) = split("host=h sslmode=verify-ca sslcert=/c.pem");
        assert!(
            settings.connector().is_err(),
            "a certificate without its key"
        );
        // Modes that check nothing need no file.
        for mode in ["disable", "prefer", "require"] {
            let (_, settings) = split(&format!("host=h sslmode={mode}"));
            settings.connector().unwrap();
        }
    }
}
