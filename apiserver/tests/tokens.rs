//! ServiceAccount tokens end to end: `kubectl create token` (TokenRequest) with default and
//! explicit duration and audience, a lifetime over the maximum shortened, the JWT's claims, rejection (401) of expired tokens, foreign
//! audiences, deleted or recreated ServiceAccounts and tampered tokens, the signing key kept
//! (mode 0600) across restarts, and a serving certificate valid for the in-cluster names.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use base64::Engine;
use common::*;
use provisioning_apiserver::auth::tokens::{DEFAULT_ISSUER, Signer};
use serde_json::{Value, json};

const SA: &str = "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: ci, namespace: demo}\n";

fn claims_of(token: &str) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
    let payload = token.split('.').nth(1).ok_or("not a JWT")?;
    Ok(serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload)?)?)
}

fn kubeconfig_with_token(
    admin: &std::path::Path,
    token: &str,
    name: &str,
) -> Result<std::path::PathBuf, Box<dyn std::error::Error + Send + Sync>> {
    let text = std::fs::read_to_string(admin)?;
    let replaced: Vec<String> =
        text.lines().map(|l| if l.trim_start().starts_with("token: ") { format!("    token: {token}") } else { l.to_string() }).collect();
    let dir = admin.parent().ok_or("kubeconfig has no parent dir")?.join(name);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("kubeconfig");
    std::fs::write(&path, replaced.join("\n") + "\n")?;
    Ok(path)
}

/// Status code of `GET /api/v1/namespaces/demo/serviceaccounts` with `token`; 401 means the
/// token was not accepted (403: accepted but not authorized, since nothing is bound).
async fn status_with(admin: &std::path::Path, token: &str, name: &str) -> Result<u16, Box<dyn std::error::Error + Send + Sync>> {
    let kc = kubeconfig_with_token(admin, token, name)?;
    let c = client_for(&kc).await?;
    let (code, _) = raw(&c, "GET", "/api/v1/namespaces/demo/serviceaccounts", "application/json", vec![]).await?;
    Ok(code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_request_and_verification() -> TestResult {
    let ts = start().await?;
    let admin = ts.server.kubeconfig_path();
    let a = |args: &[&str]| kubectl(&admin, args, None);
    let must = |out: KubectlOut, what: &str| -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
        if out.ok { Ok(out.stdout.trim().to_string()) } else { Err(format!("{what}: {}", out.stderr).into()) }
    };
    must(a(&["create", "namespace", "demo"]), "ns")?;
    must(kubectl(&admin, &["apply", "-f", "-"], Some(SA)), "sa")?;
    let uid = must(a(&["get", "sa", "ci", "-n", "demo", "-o", "jsonpath={.metadata.uid}"]), "uid")?;

    // Default: one hour, the server's audience, kube's claims.
    let token = must(a(&["create", "token", "ci", "-n", "demo"]), "create token")?;
    let c = claims_of(&token)?;
    assert_eq!(c["sub"], "system:serviceaccount:demo:ci");
    assert_eq!(c["iss"], DEFAULT_ISSUER);
    assert_eq!(c["aud"], json!([DEFAULT_ISSUER]));
    assert_eq!(c["kubernetes.io"], json!({"namespace": "demo", "serviceaccount": {"name": "ci", "uid": uid}}));
    let lifetime = c["exp"].as_i64().unwrap_or_default() - c["iat"].as_i64().unwrap_or_default();
    assert_eq!(lifetime, 3600);
    assert_eq!(status_with(&admin, &token, "t1").await?, 403, "accepted, not authorized");

    // --duration and the full TokenRequest answer.
    let out = must(a(&["create", "token", "ci", "-n", "demo", "--duration=2h", "-o", "json"]), "token -o json")?;
    let tr: Value = serde_json::from_str(&out)?;
    assert_eq!(tr["kind"], "TokenRequest");
    assert_eq!(tr["spec"]["expirationSeconds"], 7200);
    assert!(tr["status"]["expirationTimestamp"].as_str().is_some_and(|t| t.ends_with('Z')));
    let short = a(&["create", "token", "ci", "-n", "demo", "--duration=5m"]);
    assert!(!short.ok && short.stderr.contains("may not specify a duration less than 10 minutes"), "{}", short.stderr);
    // Longer than the server's maximum (48 h by default, kube-apiserver's
    // --service-account-max-token-expiration): shortened to it, with a warning, as upstream.
    let long = a(&["create", "token", "ci", "-n", "demo", "--duration=1000h", "-o", "json"]);
    assert!(long.ok, "{}", long.stderr);
    let tr: Value = serde_json::from_str(&long.stdout)?;
    assert_eq!(tr["spec"]["expirationSeconds"], 48 * 3600);
    let c = claims_of(tr["status"]["token"].as_str().unwrap_or_default())?;
    assert_eq!(c["exp"].as_i64().unwrap_or_default() - c["iat"].as_i64().unwrap_or_default(), 48 * 3600);
    assert!(long.stderr.contains("requested expiration of 3600000 seconds shortened to 172800 seconds"), "{}", long.stderr);
    let missing = a(&["create", "token", "nobody", "-n", "demo"]);
    assert!(!missing.ok && missing.stderr.contains(r#"serviceaccounts "nobody" not found"#), "{}", missing.stderr);

    // Another audience: valid JWT, but not for this server.
    let vault = must(a(&["create", "token", "ci", "-n", "demo", "--audience=vault"]), "audience token")?;
    assert_eq!(claims_of(&vault)?["aud"], json!(["vault"]));
    assert_eq!(status_with(&admin, &vault, "t2").await?, 401);
    // TokenReview reports it for the audience it was made for.
    let ac = client_for(&admin).await?;
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": vault, "audiences": ["vault"]}});
    let (code, body) =
        raw(&ac, "POST", "/apis/authentication.k8s.io/v1/tokenreviews", "application/json", serde_json::to_vec(&review)?).await?;
    assert_eq!(code, 201);
    assert_eq!(body["status"]["authenticated"], true, "{body}");
    assert_eq!(body["status"]["user"]["username"], "system:serviceaccount:demo:ci");
    assert!(!body.to_string().contains("JTI=") || body["status"]["user"]["extra"].is_object());

    // Expired: signed with the server's own key, exp in the past.
    let signer = Signer::load_or_create(ts.dir.path(), DEFAULT_ISSUER)?;
    let now = chrono::Utc::now().timestamp();
    let expired = signer.sign(&signer.claims("demo", "ci", &uid, vec![DEFAULT_ISSUER.into()], now - 7200, 3600))?;
    assert_eq!(status_with(&admin, &expired, "t3").await?, 401);
    // Tampered: the payload names another ServiceAccount.
    let parts: Vec<&str> = token.split('.').collect();
    let forged_claims = signer.claims("kube-system", "admin", &uid, vec![DEFAULT_ISSUER.into()], now, 3600);
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged_claims)?),
        parts[2]
    );
    assert_eq!(status_with(&admin, &forged, "t4").await?, 401);
    assert_eq!(status_with(&admin, "not-a-token", "t5").await?, 401);

    // The key is private and survives a restart; so do tokens.
    let mode = std::fs::metadata(ts.dir.path().join("sa.key"))?.permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let ts = restart(ts).await?;
    let admin = ts.server.kubeconfig_path();
    assert_eq!(status_with(&admin, &token, "t6").await?, 403, "still accepted after restart");

    // Deleted, then recreated under the same name (new uid): the old token is dead.
    let a = |args: &[&str]| kubectl(&admin, args, None);
    must(a(&["delete", "serviceaccount", "ci", "-n", "demo"]), "delete sa")?;
    assert_eq!(status_with(&admin, &token, "t7").await?, 401);
    must(kubectl(&admin, &["apply", "-f", "-"], Some(SA)), "recreate sa")?;
    assert_eq!(status_with(&admin, &token, "t8").await?, 401);
    let fresh = must(a(&["create", "token", "ci", "-n", "demo"]), "new token")?;
    assert_eq!(status_with(&admin, &fresh, "t9").await?, 403);

    // Service account issuer discovery, open to every ServiceAccount as upstream: the JWKS
    // holds the key that verifies the tokens.
    let fc = client_for(&kubeconfig_with_token(&admin, &fresh, "t10")?).await?;
    let (code, oidc) = raw(&fc, "GET", "/.well-known/openid-configuration", "application/json", vec![]).await?;
    assert_eq!((code, oidc["issuer"].as_str()), (200, Some(DEFAULT_ISSUER)), "{oidc}");
    let (code, jwks) = raw(&fc, "GET", "/openid/v1/jwks", "application/json", vec![]).await?;
    assert_eq!(code, 200);
    let header: Value =
        serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(fresh.split('.').next().unwrap_or_default())?)?;
    assert_eq!(jwks["keys"][0]["kid"], header["kid"], "the token's kid is published");

    // The serving certificate is valid for the in-cluster names (a pod verifies it by them).
    for name in ["kubernetes", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"] {
        let out = a(&["get", "--raw", "/version", &format!("--tls-server-name={name}")]);
        assert!(out.ok, "TLS as {name}: {}", out.stderr);
    }
    let out = a(&["get", "--raw", "/version", "--tls-server-name=evil.example"]);
    assert!(!out.ok, "a name not in the certificate is refused");

    tokio::time::timeout(Duration::from_secs(30), ts.server.shutdown()).await?;
    Ok(())
}
