//! TLS for the store's connections: plain, or rustls with verified certificates when the URL
//! asks for it.

use std::fmt;
use std::sync::Arc;

use tokio_postgres::config::SslMode;

use super::failure::pg;
use crate::config::PgConfig;
use crate::error::{Error, Result};

/// How the store's connections are made: plain, or TLS with rustls when the URL asks for it
/// (`sslmode=require`). Certificates are always verified (the server's name against its
/// certificate, the chain against the system's roots or `PgConfig::tls_roots`).
#[derive(Clone)]
pub(super) enum Tls {
    Off,
    On(tokio_postgres_rustls::MakeRustlsConnect),
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tls::Off => "Tls::Off",
            Tls::On(_) => "Tls::On",
        })
    }
}

impl Tls {
    pub(super) fn of(config: &PgConfig, pg_config: &tokio_postgres::Config) -> Result<Tls> {
        if pg_config.get_ssl_mode() != SslMode::Require {
            return Ok(Tls::Off);
        }
        use rustls::pki_types::pem::PemObject;
        let bad_roots = || Error::InvalidConfig {
            setting: "postgres_tls_root_certificates",
            expected: "one or more PEM certificates",
        };
        let mut roots = rustls::RootCertStore::empty();
        match &config.tls_roots {
            Some(pem) => {
                for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem) {
                    roots
                        .add(cert.map_err(|_| bad_roots())?)
                        .map_err(|_| bad_roots())?;
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    // One bad system certificate does not make the others unusable.
                    let _ = roots.add(cert);
                }
            }
        }
        if roots.is_empty() {
            return Err(match config.tls_roots {
                Some(_) => bad_roots(),
                None => Error::InvalidConfig {
                    setting: "postgres_tls_root_certificates",
                    expected: "certificates to trust: none were found in the system's store",
                },
            });
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| pg("connect", e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Tls::On(tokio_postgres_rustls::MakeRustlsConnect::new(tls)))
    }
}
