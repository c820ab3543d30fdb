//! Certificates, bearer token and kubeconfig kept in the data directory.
//!
//! The CA key and certificate are generated once and reused so that a kubeconfig written by
//! an earlier run stays valid; the serving certificate is re-issued from that CA on each start
//! because its subject alternative names depend on the listen address (so a data dir whose
//! certificate lacks a name gets one that has it, and existing kubeconfigs keep working).

use std::fs;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use base64::Engine;
use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// What the server needs to terminate TLS and authenticate clients.
pub struct Credentials {
    /// PEM of the CA certificate (embedded into the kubeconfig).
    pub ca_pem: String,
    /// rustls server configuration with the serving certificate.
    pub server_config: Arc<rustls::ServerConfig>,
    /// The bearer token clients must present.
    pub token: String,
}

/// The CA's parameters (subject, usages, validity). Whoever issues certificates under the same
/// CA key (the web console) signs with these, so its certificates chain to `ca.crt`.
pub fn ca_params() -> anyhow::Result<CertificateParams> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "provisioning-apiserver-ca");
    dn.push(DnType::OrganizationName, "provisioning.dev");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    p.not_before = rcgen::date_time_ymd(2024, 1, 1);
    p.not_after = rcgen::date_time_ymd(2124, 1, 1);
    Ok(p)
}

/// Writes `contents` to `path` with mode 0600 (atomically via a temp file).
pub fn write_private(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.write_all(contents)?;
        f.sync_all()?;
    }
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600))?;
    fs::rename(&tmp, path)?;
    Ok(())
}

/// Loads or creates the CA and token in `dir` and issues a serving certificate for `listen`.
pub fn load_or_create(dir: &Path, listen: SocketAddr) -> anyhow::Result<Credentials> {
    let ca_key_path = dir.join("ca.key");
    let ca_crt_path = dir.join("ca.crt");
    let (ca_key, ca_pem) = if ca_key_path.exists() && ca_crt_path.exists() {
        let key_pem = fs::read_to_string(&ca_key_path)?;
        let key = KeyPair::from_pem(&key_pem).context("parsing ca.key")?;
        (key, fs::read_to_string(&ca_crt_path)?)
    } else {
        let key = KeyPair::generate()?;
        let cert = ca_params()?.self_signed(&key)?;
        write_private(&ca_key_path, key.serialize_pem().as_bytes())?;
        write_private(&ca_crt_path, cert.pem().as_bytes())?;
        (key, cert.pem())
    };
    let issuer = Issuer::new(ca_params()?, ca_key);

    let mut params = CertificateParams::new(serving_sans(listen))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "provisioning-apiserver");
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = rcgen::date_time_ymd(2024, 1, 1);
    params.not_after = rcgen::date_time_ymd(2124, 1, 1);
    params.use_authority_key_identifier_extension = true;
    let serving_key = KeyPair::generate()?;
    let serving = params.signed_by(&serving_key, &issuer)?;
    write_private(&dir.join("serving.crt"), serving.pem().as_bytes())?;
    write_private(&dir.join("serving.key"), serving_key.serialize_pem().as_bytes())?;

    let token_path = dir.join("token");
    let token = match fs::read_to_string(&token_path) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
        _ => {
            let bytes: [u8; 32] = rand::random();
            let t: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            write_private(&token_path, t.as_bytes())?;
            t
        }
    };

    let chain = vec![serving.der().clone(), CertificateDer::from(pem_to_der(&ca_pem)?)];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(serving_key.serialize_der()));
    let mut cfg = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Credentials { ca_pem, server_config: Arc::new(cfg), token })
}

/// The in-cluster names a pod uses for the API server (the `kubernetes` Service).
pub const IN_CLUSTER_NAMES: [&str; 4] =
    ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"];

/// Subject alternative names of the serving certificate: loopback, the in-cluster names and
/// every address the server listens on (all local addresses when it listens on 0.0.0.0/::),
/// so a client in a container reaching the host by its bridge address can verify it.
pub fn serving_sans(listen: SocketAddr) -> Vec<String> {
    let mut sans: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
    sans.extend(IN_CLUSTER_NAMES.iter().map(|s| s.to_string()));
    let ip = listen.ip();
    let mut ips = vec![];
    if ip.is_unspecified() {
        ips.extend(local_addresses(ip.is_ipv6()));
    } else {
        ips.push(ip);
    }
    for ip in ips {
        if !sans.contains(&ip.to_string()) {
            sans.push(ip.to_string());
        }
    }
    sans
}

/// Addresses of this host's interfaces, read from procfs (IPv4 from the routing trie's local
/// host entries; IPv6 too when `v6`). Empty where procfs is unavailable.
fn local_addresses(v6: bool) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = vec![];
    if let Ok(trie) = fs::read_to_string("/proc/net/fib_trie") {
        let mut last: Option<Ipv4Addr> = None;
        for line in trie.lines() {
            let t = line.trim();
            if let Some(addr) = t.strip_prefix("|-- ").or_else(|| t.strip_prefix("+-- ")) {
                last = addr.split('/').next().and_then(|a| a.parse().ok());
            } else if t.contains("/32 host LOCAL")
                && let Some(a) = last
                && !out.contains(&IpAddr::V4(a))
            {
                out.push(IpAddr::V4(a));
            }
        }
    }
    if v6 && let Ok(list) = fs::read_to_string("/proc/net/if_inet6") {
        for line in list.lines() {
            let Some(hex) = line.split_whitespace().next() else { continue };
            let Ok(n) = u128::from_str_radix(hex, 16) else { continue };
            let a = IpAddr::V6(Ipv6Addr::from(n));
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    out
}

fn pem_to_der(pem: &str) -> anyhow::Result<Vec<u8>> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    Ok(base64::engine::general_purpose::STANDARD.decode(body.trim())?)
}

/// The address clients should use for a listen address (unspecified becomes loopback).
pub fn client_host(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        IpAddr::V4(v) if v.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v) if v.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        other => other,
    };
    match ip {
        IpAddr::V4(v) => format!("{v}:{}", listen.port()),
        IpAddr::V6(v) => format!("[{v}]:{}", listen.port()),
    }
}

/// Writes `dir/kubeconfig` (mode 0600) pointing at `listen` with the CA and token embedded.
pub fn write_kubeconfig(dir: &Path, listen: SocketAddr, creds: &Credentials) -> anyhow::Result<std::path::PathBuf> {
    let ca_b64 = base64::engine::general_purpose::STANDARD.encode(creds.ca_pem.as_bytes());
    let server = format!("https://{}", client_host(listen));
    let cfg = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: provisioning\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca_b64}\nusers:\n- name: provisioning-admin\n  user:\n    token: {token}\ncontexts:\n- name: provisioning\n  context:\n    cluster: provisioning\n    user: provisioning-admin\ncurrent-context: provisioning\npreferences: {{}}\n",
        token = creds.token
    );
    let path = dir.join("kubeconfig");
    write_private(&path, cfg.as_bytes())?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_names_cover_in_cluster_names_and_listen_addresses() -> anyhow::Result<()> {
        let sans = serving_sans("10.1.2.3:6443".parse()?);
        for name in IN_CLUSTER_NAMES.iter().chain(&["localhost", "127.0.0.1", "10.1.2.3"]) {
            assert!(sans.iter().any(|s| s == name), "{name} missing from {sans:?}");
        }
        // Listening on every address: each local IPv4 address the kernel knows is included.
        let all = serving_sans("0.0.0.0:6443".parse()?);
        for a in local_addresses(false) {
            assert!(all.contains(&a.to_string()), "{a} missing from {all:?}");
        }
        assert!(!all.iter().any(|s| s == "0.0.0.0"));
        Ok(())
    }
}
