//! Logic of the cloud-only services that can run without a cloud: which server does what.

mod common;

use common::{crate_dir, nu};

fn nu_eval(script: &str) -> String {
    let out = std::process::Command::new(nu())
        .current_dir(crate_dir().join("catalog"))
        .args(["--no-config-file", "-c", script])
        .output()
        .expect("nu runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

const CLUSTER: &str = r#"let base = {config: {controlPlanePool: "control-plane", controlPlaneEndpoint: ""}, peers: [], cluster: {name: "k", servers: [
  {name: "cp-1", addresses: [{type: InternalIP, address: "10.0.0.2"}], pool: "control-plane"},
  {name: "cp-0", addresses: [{type: InternalIP, address: "10.0.0.1"}], pool: "control-plane"},
  {name: "w-0", addresses: [{type: InternalIP, address: "10.0.0.9"}], pool: "workers"}]}}
"#;

#[test]
fn kubeadm_roles_first_control_plane_inits_others_join() {
    let script = format!(
        "use kubernetes/common.nu *\n{CLUSTER}[cp-0 cp-1 w-0] | each {{|s| role ($base | insert server {{name: $s, addresses: []}}) }} | str join ','"
    );
    assert_eq!(nu_eval(&script), "init,control-plane,worker");
    let script = format!("use kubernetes/common.nu *\n{CLUSTER}api-endpoint ($base | insert server {{name: w-0}})");
    assert_eq!(nu_eval(&script), "10.0.0.1:6443");
    assert_eq!(nu_eval("use kubernetes/common.nu *; minor-of 1.31.4"), "v1.31");
}

#[test]
fn addons_act_only_from_the_first_control_plane() {
    let script = format!(
        "use lib/k8s.nu *\n{CLUSTER}[cp-0 cp-1 w-0] | each {{|s| is-api-runner ($base | insert server {{name: $s}}) control-plane }} | str join ','"
    );
    assert_eq!(nu_eval(&script), "true,false,false");
}

fn openssl(args: &[&str], dir: &std::path::Path) -> String {
    let out =
        std::process::Command::new("openssl").current_dir(dir).args(args).output().expect("openssl runs (installed by scripts/setup.sh)");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn joins_pin_the_ca_made_from_the_generated_key_in_a_0600_config() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    openssl(&["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ca.key"], d);
    // The certificate exactly as install.nu makes it on the first control plane.
    openssl(
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-sha256",
            "-days",
            "1",
            "-subj",
            "/CN=kubernetes",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign",
            "-out",
            "ca.crt",
        ],
        d,
    );
    openssl(&["x509", "-in", "ca.crt", "-pubkey", "-noout", "-out", "pub.pem"], d);
    openssl(&["pkey", "-pubin", "-in", "pub.pem", "-outform", "DER", "-out", "pub.der"], d);
    // kubeadm's hash: SHA-256 of the certificate's SubjectPublicKeyInfo.
    let out = std::process::Command::new("sha256sum").arg(d.join("pub.der")).output().expect("sha256sum");
    let expected = format!("sha256:{}", String::from_utf8_lossy(&out.stdout).split(' ').next().unwrap_or_default());
    let key = d.join("ca.key");
    let hash = nu_eval(&format!("use kubernetes/common.nu *; ca-cert-hash (open --raw '{}' | decode utf-8)", key.display()));
    assert_eq!(hash, expected);

    let ctx = r#"{server: {name: w-0}, config: {bootstrapToken: "abcdef.0123456789abcdef", certificateKey: "cafe"}}"#;
    let worker: serde_json::Value =
        serde_json::from_str(&nu_eval(&format!("use kubernetes/common.nu *; join-config {ctx} 10.0.0.1:6443 {hash} false 10.0.0.9")))
            .expect("JSON");
    assert_eq!(worker["discovery"]["bootstrapToken"]["caCertHashes"][0], hash.as_str());
    assert_eq!(worker["discovery"]["bootstrapToken"]["token"], "abcdef.0123456789abcdef");
    assert!(worker.get("controlPlane").is_none(), "{worker}");
    let cp: serde_json::Value =
        serde_json::from_str(&nu_eval(&format!("use kubernetes/common.nu *; join-config {ctx} 10.0.0.1:6443 {hash} true 10.0.0.2")))
            .expect("JSON");
    assert_eq!(cp["controlPlane"]["certificateKey"], "cafe");
    assert_eq!(cp["controlPlane"]["localAPIEndpoint"]["advertiseAddress"], "10.0.0.2");

    let file = d.join("sub/join.yaml");
    nu_eval(&format!("use kubernetes/common.nu *; write-secret-file '{}' 'token: x' | ignore", file.display()));
    let meta = std::fs::metadata(&file).expect("written");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::read_to_string(&file).expect("read"), "token: x");
}

/// Downloads a script runs as root are verified: no pin → refused before downloading; a
/// wrong pin → refused and the file deleted; the right pin → kept (file:// stands in for
/// the release server).
#[test]
fn downloads_need_a_matching_pinned_sha256() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("release.tar.gz");
    std::fs::write(&source, b"release bytes").expect("write");
    let url = format!("file://{}", source.display());
    let dest = dir.path().join("downloaded");
    let run = |pin: &str| {
        std::process::Command::new(nu())
            .current_dir(crate_dir().join("catalog"))
            .args(["--no-config-file", "-c", &format!("use lib/k8s.nu *; fetch '{url}' '{}' --sha256 '{pin}'", dest.display())])
            .output()
            .expect("nu runs")
    };
    let unpinned = run("");
    assert!(!unpinned.status.success() && String::from_utf8_lossy(&unpinned.stderr).contains("no pinned sha256"));
    assert!(!dest.exists(), "nothing downloaded without a pin");
    let wrong = run(&"0".repeat(64));
    assert!(!wrong.status.success() && String::from_utf8_lossy(&wrong.stderr).contains("sha256 mismatch"));
    assert!(!dest.exists(), "a mismatching download is deleted");
    // sha256("release bytes")
    let right = {
        use std::io::Write;
        let mut child = std::process::Command::new("sha256sum")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sha256sum");
        child.stdin.take().expect("stdin").write_all(b"release bytes").expect("write");
        let out = child.wait_with_output().expect("sha256sum output");
        String::from_utf8_lossy(&out.stdout).split_whitespace().next().unwrap_or_default().to_string()
    };
    let ok = run(&right);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert_eq!(std::fs::read(&dest).expect("downloaded"), b"release bytes");
}

/// The pkgs.k8s.io Release.key is trusted only with the pinned fingerprint: install.nu checks
/// the download before dearmoring it into the keyring, and the check refuses any other key (a
/// throwaway key made here stands in for a substituted one) and accepts the pinned one.
#[test]
fn the_kubernetes_apt_key_must_have_the_pinned_fingerprint() -> Result<(), Box<dyn std::error::Error>> {
    let install = std::fs::read_to_string(crate_dir().join("catalog/kubernetes/install.nu"))?;
    let (verify, dearmor) = (install.find("verify-key-fingerprint /tmp/k8s-release.key"), install.find("--dearmor"));
    assert!(verify.is_some() && verify < dearmor, "install.nu verifies the key before trusting it");

    let home = tempfile::tempdir()?;
    let gpg = |args: &[&str]| std::process::Command::new("gpg").env("GNUPGHOME", home.path()).args(args).output();
    let made = gpg(&["--batch", "--passphrase", "", "--quick-gen-key", "Throwaway <t@example.invalid>", "ed25519", "sign", "never"])?;
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let key = home.path().join("substitute.asc");
    std::fs::write(&key, gpg(&["--batch", "--armor", "--export", "t@example.invalid"])?.stdout)?;
    let listed =
        String::from_utf8_lossy(&gpg(&["--batch", "--with-colons", "--show-keys", &key.display().to_string()])?.stdout).into_owned();
    let own = listed.lines().find_map(|l| l.strip_prefix("fpr:::::::::")).and_then(|r| r.split(':').next()).unwrap_or_default().to_string();
    assert_eq!(own.len(), 40, "{listed}");
    let check = |pin: &str| {
        std::process::Command::new(nu())
            .current_dir(crate_dir().join("catalog"))
            .env("GNUPGHOME", home.path())
            .args(["--no-config-file", "-c", &format!("use kubernetes/common.nu *; verify-key-fingerprint '{}' {pin}", key.display())])
            .output()
    };
    let refused = check("$K8S_APT_KEY_FINGERPRINT")?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a key other than the pinned one is refused");
    for want in [own.as_str(), "is not the pinned", "DE15B14486CD377B9E876E1A234654DA9A296436", "refusing to trust it"] {
        assert!(stderr.contains(want), "{want}: {stderr}");
    }
    let accepted = check(&own)?;
    assert!(accepted.status.success(), "{}", String::from_utf8_lossy(&accepted.stderr));
    let garbage = home.path().join("garbage.key");
    std::fs::write(&garbage, "<html>not a key</html>")?;
    let out = std::process::Command::new(nu())
        .current_dir(crate_dir().join("catalog"))
        .env("GNUPGHOME", home.path())
        .args([
            "--no-config-file",
            "-c",
            &format!("use kubernetes/common.nu *; verify-key-fingerprint '{}' $K8S_APT_KEY_FINGERPRINT", garbage.display()),
        ])
        .output()?;
    assert!(!out.status.success(), "a download that is no key is refused");
    Ok(())
}

#[test]
fn the_first_control_plane_reports_its_kubeconfig_on_a_line_the_runner_withholds() -> Result<(), Box<dyn std::error::Error>> {
    let kubeconfig = "apiVersion: v1\nkind: Config\nusers:\n- name: admin\n  user: {client-key-data: S0VZ}\n";
    let line = nu_eval(&format!("use kubernetes/common.nu *; kubeconfig-secret-line {}", serde_json::to_string(kubeconfig)?));
    assert!(line.starts_with(provisioning_taskservs::SECRET_MARKER), "{line}");
    let parsed = provisioning_taskservs::parse_secret(&format!("==> kubeadm init\n{line}\n")).ok_or("no secret line")??;
    assert_eq!(parsed["kubeconfig"], kubeconfig);
    Ok(())
}

#[test]
fn a_late_joiner_gets_the_join_token_again_for_an_hour_only() -> Result<(), Box<dyn std::error::Error>> {
    // Which servers have not joined: the Cluster's servers that are not nodes.
    let script =
        format!("use kubernetes/common.nu *\n{CLUSTER}not-yet-joined ($base | insert server {{name: cp-0}}) [cp-0 cp-1] | str join ','");
    assert_eq!(nu_eval(&script), "w-0");
    let script =
        format!("use kubernetes/common.nu *\n{CLUSTER}not-yet-joined ($base | insert server {{name: cp-0}}) [w-0 cp-1 cp-0] | length");
    assert_eq!(nu_eval(&script), "0");
    // The InitConfiguration `kubeadm token create --config` reads: the generated token, 1h.
    let script = "use kubernetes/common.nu *; token-config {config: {bootstrapToken: \"abcdef.0123456789abcdef\", certificateKey: \"k\"}}";
    let config: serde_json::Value = serde_json::from_str(&nu_eval(script))?;
    assert_eq!((config["apiVersion"].as_str(), config["kind"].as_str()), (Some("kubeadm.k8s.io/v1beta4"), Some("InitConfiguration")));
    let token = &config["bootstrapTokens"][0];
    assert_eq!((token["token"].as_str(), token["ttl"].as_str()), (Some("abcdef.0123456789abcdef"), Some("1h0m0s")));
    assert_eq!(token["usages"], serde_json::json!(["signing", "authentication"]));
    assert_eq!(config["certificateKey"], "k", "a late control plane gets the certificates uploaded again");
    // kubeadm init's own token is as short-lived.
    let init = std::fs::read_to_string(crate_dir().join("catalog/kubernetes/templates/kubeadm-init.yaml"))?;
    assert!(init.contains("ttl: 1h0m0s") && !init.contains("24h"), "{init}");
    Ok(())
}
