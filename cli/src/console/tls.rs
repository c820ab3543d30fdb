//! The console's HTTPS certificate: issued from `provisioning dev`'s CA (whose files live in the
//! data dir, so trusting `ca.crt` once covers the API server and the console), loaded from
//! files given on the command line, or self-signed in memory.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use rcgen::{CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Where the certificate comes from.
#[derive(Clone, Debug)]
pub enum CertSource {
    /// Issue one from the CA in this directory (`ca.crt`, `ca.key`, as the embedded API server
    /// writes them); the result is written next to them as `console.crt` / `console.key`.
    DevCa(std::path::PathBuf),
    /// PEM files: certificate chain and private key.
    Files {
        /// Certificate chain (PEM).
        cert: std::path::PathBuf,
        /// Private key (PEM).
        key: std::path::PathBuf,
    },
    /// A self-signed certificate generated at start-up (browsers warn once).
    SelfSigned,
}

/// The subject names of the console's certificate: loopback and the listen address.
fn sans(listen: SocketAddr) -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    let ip = listen.ip().to_string();
    if !listen.ip().is_unspecified() && !names.contains(&ip) {
        names.push(ip);
    }
    names
}

fn leaf_params(listen: SocketAddr) -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(sans(listen))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "provisioning-console");
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    Ok(params)
}

fn server_config(chain: Vec<CertificateDer<'static>>, key: PrivateKeyDer<'static>) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let mut cfg = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(chain, key).context("console certificate")?;
    // HTTP/1.1 only: server-sent events need nothing more, and it keeps one code path.
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Issues a serving certificate for `listen` from the CA in `dir` and writes it there.
pub fn issue_from_dev_ca(dir: &Path, listen: SocketAddr) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let ca_key = KeyPair::from_pem(&std::fs::read_to_string(dir.join("ca.key")).context("reading the dev CA key (ca.key)")?)
        .context("parsing ca.key")?;
    let ca_pem = std::fs::read_to_string(dir.join("ca.crt")).context("reading the dev CA (ca.crt)")?;
    let ca_der = CertificateDer::from_pem_slice(ca_pem.as_bytes()).context("parsing ca.crt")?;
    let issuer = Issuer::new(provisioning_apiserver::tls::ca_params()?, ca_key);
    let mut params = leaf_params(listen)?;
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2124, 1, 1);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    provisioning_apiserver::tls::write_private(&dir.join("console.crt"), cert.pem().as_bytes())?;
    provisioning_apiserver::tls::write_private(&dir.join("console.key"), key.serialize_pem().as_bytes())?;
    Ok((vec![cert.der().clone(), ca_der], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()))))
}

/// The rustls configuration for `source`.
pub fn load(source: &CertSource, listen: SocketAddr) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    match source {
        CertSource::DevCa(dir) => {
            let (chain, key) = issue_from_dev_ca(dir, listen)?;
            server_config(chain, key)
        }
        CertSource::Files { cert, key } => {
            let chain = CertificateDer::pem_file_iter(cert)
                .with_context(|| format!("reading {}", cert.display()))?
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("parsing {}", cert.display()))?;
            anyhow::ensure!(!chain.is_empty(), "{} holds no certificate", cert.display());
            let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading the private key {}", key.display()))?;
            server_config(chain, key)
        }
        CertSource::SelfSigned => {
            let key = KeyPair::generate()?;
            let cert = leaf_params(listen)?.self_signed(&key)?;
            server_config(vec![cert.der().clone()], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_certificate_chains_to_the_api_servers_ca() -> anyhow::Result<()> {
        provisioning_controller::install_crypto_provider();
        let dir = tempfile::tempdir()?;
        let listen: SocketAddr = "127.0.0.1:0".parse()?;
        provisioning_apiserver::tls::load_or_create(dir.path(), listen)?;
        let (chain, _) = issue_from_dev_ca(dir.path(), listen)?;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(dir.path().join("ca.crt"))?)?;
        let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots)).build()?;
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
        use rustls::client::danger::ServerCertVerifier;
        verifier.verify_server_cert(&chain[0], &chain[1..], &name, &[], rustls::pki_types::UnixTime::now())?;
        assert!(dir.path().join("console.crt").exists() && dir.path().join("console.key").exists());
        Ok(())
    }
}
