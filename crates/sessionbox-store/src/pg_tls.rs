//! TLS to the PostgreSQL store, with rustls (the ring provider), as the URL's `sslmode` and
//! `sslrootcert` ask.
//!
//! | `sslmode` | connection | server certificate |
//! | --- | --- | --- |
//! | absent, `disable` | plain | - |
//! | `prefer` | TLS when the server offers it, else plain | not checked (as libpq) |
//! | `require` | TLS or fail | not checked; with `sslrootcert`, as `verify-ca` (as libpq) |
//! | `verify-ca` | TLS or fail | chain to a CA in `sslrootcert` |
//! | `verify-full` | TLS or fail | chain to a CA in `sslrootcert`, and names the host |
//!
//! The `postgres` client parses neither `verify-*` nor `sslrootcert`, so [`split_url`] takes
//! both options out of the URL (either form) before it is parsed.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use sessionbox_core::{Error, Result};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What the URL's `sslmode` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// No `sslmode`: plain, as before TLS support.
    Absent,
    /// `disable`.
    Disable,
    /// `prefer`.
    Prefer,
    /// `require`.
    Require,
    /// `verify-ca`.
    VerifyCa,
    /// `verify-full`.
    VerifyFull,
}

/// The TLS options taken out of a store URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsOptions {
    pub(crate) mode: SslMode,
    pub(crate) root_cert: Option<PathBuf>,
}

fn parse_mode(v: &str) -> Result<SslMode> {
    Ok(match v {
        "disable" => SslMode::Disable,
        "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        _ => {
            return Err(Error::InvalidRequest(format!(
                "the PostgreSQL store URL's sslmode={v:?} is not one of disable, prefer, \
                 require, verify-ca, verify-full"
            )));
        }
    })
}

fn percent_decode(v: &str) -> String {
    let hex = |c: Option<&u8>| c.and_then(|&c| (c as char).to_digit(16));
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (b[i], hex(b.get(i + 1)), hex(b.get(i + 2))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Takes `sslmode` and `sslrootcert` out of `url` (a `postgres://` URL's query, or a
/// `key=value` string): the URL without them, and what they said.
///
/// # Errors
/// [`Error::InvalidRequest`] for an `sslmode` that is none of the five above, or `verify-ca`
/// / `verify-full` without `sslrootcert`.
pub(crate) fn split_url(url: &str) -> Result<(String, TlsOptions)> {
    let mut mode = None;
    let mut root = None;
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_owned(),
            Some((base, query)) => {
                let mut kept = Vec::new();
                for pair in query.split('&') {
                    match pair.split_once('=') {
                        Some(("sslmode", v)) => mode = Some(percent_decode(v)),
                        Some(("sslrootcert", v)) => root = Some(percent_decode(v)),
                        _ => kept.push(pair),
                    }
                }
                if kept.is_empty() {
                    base.to_owned()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        // key=value pairs; values with spaces are single-quoted, which only the two options
        // taken here need to understand for their own values.
        let mut kept = Vec::new();
        let mut words = url.split_whitespace().peekable();
        while let Some(w) = words.next() {
            let Some((k, v)) = w.split_once('=') else {
                kept.push(w.to_owned());
                continue;
            };
            let mut value = v.to_owned();
            if value.starts_with('\'') {
                while !(value.len() > 1 && value.ends_with('\'')) {
                    match words.next() {
                        Some(more) => {
                            value.push(' ');
                            value.push_str(more);
                        }
                        None => break,
                    }
                }
            }
            match k {
                "sslmode" => mode = Some(value.trim_matches('\'').to_owned()),
                "sslrootcert" => root = Some(value.trim_matches('\'').to_owned()),
                _ => kept.push(format!("{k}={value}")),
            }
        }
        kept.join(" ")
    };
    let mode = match mode {
        None => SslMode::Absent,
        Some(m) => parse_mode(&m)?,
    };
    let root_cert = root.filter(|r| !r.is_empty()).map(PathBuf::from);
    if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && root_cert.is_none() {
        return Err(Error::InvalidRequest(
            "the PostgreSQL store URL's sslmode=verify-ca or verify-full needs \
             sslrootcert=FILE, the PEM file of the CA that signed the server's certificate"
                .into(),
        ));
    }
    Ok((rest, TlsOptions { mode, root_cert }))
}

/// How the server's certificate is checked.
enum Check {
    /// Not at all (signatures of the handshake are still checked).
    Nothing,
    /// Chained to a root in the file; the host name is not looked at.
    Chain,
    /// Chained, and naming the host.
    Full,
}

/// A rustls client configuration for `options`, or `None` for a plain connection.
///
/// # Errors
/// [`Error::InvalidRequest`] when the `sslrootcert` file cannot be read or holds no certificate
/// that can be a root.
pub(crate) fn client_config(options: &TlsOptions) -> Result<Option<Arc<rustls::ClientConfig>>> {
    let check = match (options.mode, &options.root_cert) {
        (SslMode::Absent | SslMode::Disable, _) => return Ok(None),
        (SslMode::Prefer, _) => Check::Nothing,
        (SslMode::Require, None) => Check::Nothing,
        (SslMode::Require | SslMode::VerifyCa, Some(_)) => Check::Chain,
        (SslMode::VerifyFull, Some(_)) => Check::Full,
        // split_url refused these.
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => Check::Full,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Backend(format!("cannot configure TLS: {e}")))?;
    let roots = match &options.root_cert {
        Some(path) => Some(Arc::new(read_roots(path)?)),
        None => None,
    };
    let verifier: Arc<dyn ServerCertVerifier> = match (check, roots) {
        (Check::Nothing, _) | (_, None) => Arc::new(AnyCertificate(provider)),
        (check, Some(roots)) => {
            let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
                roots,
                provider.clone(),
            )
            .build()
            .map_err(|e| {
                Error::InvalidRequest(format!(
                    "cannot use the PostgreSQL store's sslrootcert: {e}"
                ))
            })?;
            match check {
                Check::Chain => Arc::new(ChainOnly(webpki)),
                _ => webpki,
            }
        }
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(Arc::new(config)))
}

fn read_roots(path: &Path) -> Result<rustls::RootCertStore> {
    let bad = |why: String| {
        Error::InvalidRequest(format!(
            "the PostgreSQL store's sslrootcert {}: {why}",
            path.display()
        ))
    };
    let pem = std::fs::read(path).map_err(|e| bad(format!("cannot be read: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("is not PEM: {e}")))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(bad("holds no usable CA certificate".into()));
    }
    Ok(roots)
}

/// `sslmode=require` (or `prefer`) without a CA: any certificate, as libpq does; the
/// handshake's signatures are still verified, so the session is encrypted to whoever holds the
/// certificate's key.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `sslmode=verify-ca`: the chain is checked, the host name is not.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
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
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// [`MakeTlsConnect`] over rustls, for the `postgres` client.
#[derive(Clone)]
pub(crate) struct MakeRustls(pub(crate) Arc<rustls::ClientConfig>);

impl std::fmt::Debug for MakeRustls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MakeRustls")
    }
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, domain: &str) -> io::Result<RustlsConnect> {
        let name = ServerName::try_from(domain.to_owned()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{domain:?} is not a host name TLS can check"),
            )
        })?;
        Ok(RustlsConnect {
            config: self.0.clone(),
            name,
        })
    }
}

/// One connection's [`TlsConnect`].
pub(crate) struct RustlsConnect {
    config: Arc<rustls::ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let s = tokio_rustls::TlsConnector::from(self.config)
                .connect(self.name, stream)
                .await?;
            Ok(RustlsStream(s))
        })
    }
}

/// A TLS stream to the server.
pub(crate) struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM's channel binding is optional (`channel_binding=prefer`, the default).
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_options_leave_the_url_and_the_rest_stays() {
        let (rest, o) =
            split_url("postgres://u@h:5/db?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&application_name=x")
                .unwrap();
        assert_eq!(rest, "postgres://u@h:5/db?application_name=x");
        assert_eq!(o.mode, SslMode::VerifyFull);
        assert_eq!(o.root_cert, Some(PathBuf::from("/tmp/ca.pem")));

        let (rest, o) = split_url("postgresql://u@h/db?sslmode=require").unwrap();
        assert_eq!(rest, "postgresql://u@h/db");
        assert_eq!((o.mode, o.root_cert), (SslMode::Require, None));

        let (rest, o) = split_url("postgres://u@h/db").unwrap();
        assert_eq!(rest, "postgres://u@h/db");
        assert_eq!(o.mode, SslMode::Absent);

        let (rest, o) =
            split_url("host=h dbname=d sslmode=verify-ca sslrootcert='/a b/ca.pem' user=u")
                .unwrap();
        assert_eq!(rest, "host=h dbname=d user=u");
        assert_eq!(o.mode, SslMode::VerifyCa);
        assert_eq!(o.root_cert, Some(PathBuf::from("/a b/ca.pem")));
    }

    #[test]
    fn a_bad_sslmode_or_verification_without_a_ca_is_refused() {
        let e = split_url("postgres://u@h/db?sslmode=allow-ish").unwrap_err();
        assert!(e.to_string().contains("allow-ish"), "{e}");
        let e = split_url("postgres://u@h/db?sslmode=verify-full").unwrap_err();
        assert!(e.to_string().contains("sslrootcert=FILE"), "{e}");
        let o = TlsOptions {
            mode: SslMode::VerifyFull,
            root_cert: Some(PathBuf::from("/nonexistent/ca.pem")),
        };
        let e = client_config(&o).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
        let plain = TlsOptions {
            mode: SslMode::Disable,
            root_cert: None,
        };
        assert!(client_config(&plain).unwrap().is_none());
    }
}
