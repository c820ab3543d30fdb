//! `configFrom` and generated secrets against the embedded API server, with the controller
//! in-process and the real catalog. The TaskServs select no servers: what is checked is the
//! dereference (Secrets read, generated, owned, re-used), the conditions and the redaction,
//! not script runs (the local-provider end-to-end test `tests/tests/local_secrets.rs` does those).

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use provisioning_controller::testing::{TestEnv, simulated_workspace, wait_for};
use provisioning_crds::{TaskServ, Workspace};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);
const NS: &str = "inputs";

fn taskserv(name: &str, spec: serde_json::Value) -> anyhow::Result<TaskServ> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "provisioning.dev/v1alpha1", "kind": "TaskServ",
        "metadata": {"name": name, "namespace": NS}, "spec": spec
    }))?)
}

fn secret(name: &str, key: &str, value: &str) -> anyhow::Result<Secret> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS}, "stringData": {key: value}
    }))?)
}

/// (status, reason, message) of a condition, once the TaskServ has it.
fn cond(ts: &TaskServ, type_: &str) -> Option<(String, String, String)> {
    ts.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_).map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn wait_ts(api: &Api<TaskServ>, name: &str, what: &str, check: impl Fn(&TaskServ) -> bool) -> anyhow::Result<TaskServ> {
    wait_for(&format!("TaskServ {name} {what}"), DEADLINE, || {
        let api = api.clone();
        let name = name.to_string();
        let check = &check;
        async move { api.get(&name).await.ok().filter(|t| check(t)) }
    })
    .await
}

async fn secret_value(api: &Api<Secret>, name: &str, key: &str) -> Option<String> {
    let s = api.get_opt(name).await.ok()??;
    let bytes = s.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

async fn workspace(client: &Client) -> anyhow::Result<()> {
    let ws: Workspace = simulated_workspace(NS, 0, 0, 10, 5);
    Api::<Workspace>::all(client.clone()).create(&PostParams::default(), &ws).await?;
    let api = Api::<Workspace>::all(client.clone());
    wait_for("workspace Ready", DEADLINE, || {
        let api = api.clone();
        async move {
            let ws = api.get(NS).await.ok()?;
            ws.status.as_ref().filter(|s| provisioning_controller::conditions::is_true(&s.conditions, "Ready")).map(|_| ())
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_generated_once_owned_waited_for_and_never_echoed() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let controller = env.start_controller(env.config());
    workspace(&env.client).await?;
    let tss: Api<TaskServ> = Api::namespaced(env.client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), NS);

    // 1. An unset secret field is generated into a Secret the TaskServ owns…
    let created = tss.create(&PostParams::default(), &taskserv("cache", json!({"service": "redis"}))?).await?;
    let ts = wait_ts(&tss, "cache", "names its generated Secret", |t| {
        t.status.as_ref().and_then(|s| s.generated_secret_ref.as_ref()).is_some_and(|r| r.name == "cache-generated")
    })
    .await?;
    let hash = ts.status.as_ref().and_then(|s| s.config_inputs_hash.clone()).unwrap_or_default();
    assert!(hash.starts_with("sha256:"), "{hash:?}");
    let generated = secrets.get("cache-generated").await?;
    let owner = generated.owner_references().first().cloned().expect("an owner");
    assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("TaskServ", created.uid().unwrap_or_default().as_str()));
    let password = secret_value(&secrets, "cache-generated", "password").await.unwrap_or_default();
    assert_eq!(password.len(), 32);

    // …and re-used: a forced reconcile changes neither the value nor the hash.
    let stamp = json!({"metadata": {"annotations": {"provisioning.dev/reconcile-requested-at": "now"}}});
    tss.patch("cache", &PatchParams::default(), &Patch::Merge(&stamp)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(secret_value(&secrets, "cache-generated", "password").await.unwrap_or_default(), password);
    let again = tss.get("cache").await?;
    assert_eq!(again.status.as_ref().and_then(|s| s.config_inputs_hash.clone()).unwrap_or_default(), hash);

    // kubeadm's secrets are generated in the formats kubeadm accepts.
    tss.create(&PostParams::default(), &taskserv("k8s", json!({"service": "kubernetes"}))?).await?;
    wait_ts(&tss, "k8s", "names its generated Secret", |t| {
        t.status.as_ref().and_then(|s| s.generated_secret_ref.as_ref()).is_some_and(|r| r.name == "k8s-generated")
    })
    .await?;
    let token = secret_value(&secrets, "k8s-generated", "bootstrapToken").await.unwrap_or_default();
    let token_ok = token.len() == 23
        && token.char_indices().all(|(i, c)| if i == 6 { c == '.' } else { c.is_ascii_lowercase() || c.is_ascii_digit() });
    assert!(token_ok, "bootstrapToken is not [a-z0-9]{{6}}.[a-z0-9]{{16}}");
    let key = secret_value(&secrets, "k8s-generated", "certificateKey").await.unwrap_or_default();
    assert!(key.len() == 64 && key.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')), "certificateKey is not 64 hex digits");
    let ca = secret_value(&secrets, "k8s-generated", "caKey").await.unwrap_or_default();
    assert!(ca.starts_with("-----BEGIN PRIVATE KEY-----"), "caKey is not a PEM private key");
    let k8s = tss.get("k8s").await?;
    assert!(cond(&k8s, "Stalled").is_some_and(|c| c.0 == "False"), "the generated values pass the schema");

    // 2. A Secret of that name that is not the TaskServ's is never taken over.
    secrets.create(&PostParams::default(), &secret("other-generated", "password", "users-own")?).await?;
    tss.create(&PostParams::default(), &taskserv("other", json!({"service": "redis"}))?).await?;
    let other = wait_ts(&tss, "other", "Stalled on the foreign Secret", |t| {
        cond(t, "Stalled").is_some_and(|c| c.0 == "True" && c.1 == "GeneratedSecretConflict")
    })
    .await?;
    assert!(cond(&other, "Stalled").is_some_and(|c| c.2.contains("other-generated")));
    assert_eq!(secret_value(&secrets, "other-generated", "password").await.as_deref(), Some("users-own"));

    // 3. A missing Secret: Stalled naming it and its key; its creation lets it go on at once.
    let spec = json!({"service": "postgresql", "config": {"user": "app"},
        "configFrom": [{"kind": "Secret", "name": "db-creds", "key": "password", "targetPath": "password"}]});
    tss.create(&PostParams::default(), &taskserv("db", spec)?).await?;
    let db =
        wait_ts(&tss, "db", "waiting for db-creds", |t| cond(t, "Stalled").is_some_and(|c| c.0 == "True" && c.1 == "ConfigFromMissing"))
            .await?;
    let message = cond(&db, "Stalled").map(|c| c.2).unwrap_or_default();
    assert!(message.contains("Secret inputs/db-creds") && message.contains("\"password\""), "{message}");
    secrets.create(&PostParams::default(), &secret("db-creds", "password", "db-pass-VALUE-1")?).await?;
    let started = std::time::Instant::now();
    let db = wait_ts(&tss, "db", "no longer Stalled", |t| cond(t, "Stalled").is_some_and(|c| c.0 == "False")).await?;
    // The Secret watch, not the 300 s requeue of a Stalled object.
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
    // Nothing left to generate: the password came from the Secret.
    assert!(db.status.as_ref().and_then(|s| s.generated_secret_ref.as_ref()).is_none());
    assert!(secrets.get_opt("db-generated").await?.is_none());
    let first_hash = db.status.as_ref().and_then(|s| s.config_inputs_hash.clone()).unwrap_or_default();
    // A rotation changes the recorded hash.
    let rotated = json!({"stringData": {"password": "db-pass-VALUE-2"}});
    secrets.patch("db-creds", &PatchParams::default(), &Patch::Merge(&rotated)).await?;
    wait_ts(&tss, "db", "with a new inputs hash", |t| {
        t.status.as_ref().and_then(|s| s.config_inputs_hash.clone()).is_some_and(|h| h != first_hash)
    })
    .await?;

    // 4. A secret field that breaks its schema: refused by path and rule, never echoed.
    // (redis takes any characters in its password, escaped in redis.conf: the violation here is
    // the type — a list where a string belongs — merged from the Secret's YAML.)
    secrets.create(&PostParams::default(), &secret("bad-creds", "values.yaml", "password: [\"bad\\\"QUOTED-VALUE-42\"]")?).await?;
    let spec = json!({"service": "redis", "configFrom": [{"kind": "Secret", "name": "bad-creds", "key": "values.yaml"}]});
    tss.create(&PostParams::default(), &taskserv("bad", spec)?).await?;
    let bad = wait_ts(&tss, "bad", "refused", |t| cond(t, "Stalled").is_some_and(|c| c.1 == "InvalidConfig")).await?;
    let message = cond(&bad, "Stalled").map(|c| c.2).unwrap_or_default();
    assert!(message.contains("/password") && !message.contains("QUOTED-VALUE-42"), "{message}");

    // No value in any status or event.
    let all = serde_json::to_string(&tss.list(&Default::default()).await?.items)?;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), NS);
    let events = serde_json::to_string(&events.list(&Default::default()).await?.items)?;
    for value in [password.as_str(), "db-pass-VALUE", "QUOTED-VALUE-42", "users-own"] {
        assert!(!all.contains(value), "a secret value is in a TaskServ");
        assert!(!events.contains(value), "a secret value is in an event");
    }
    controller.stop().await;
    env.shutdown().await;
    Ok(())
}

/// configFrom values over 256 KiB together are refused while they are read (the controller
/// stops at the entry that passes the limit, before keeping it), naming that entry; nothing
/// of the value is echoed (twelfth re-review, H2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_from_values_over_the_limit_are_refused_while_read() -> anyhow::Result<()> {
    let env = TestEnv::start().await?;
    let controller = env.start_controller(env.config());
    workspace(&env.client).await?;
    let tss: Api<TaskServ> = Api::namespaced(env.client.clone(), NS);
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), NS);
    secrets.create(&PostParams::default(), &secret("big", "value", &"BIGVALUE".repeat(20_000))?).await?;
    // 32 entries naming the same 160 KB value: the second passes the limit.
    let entries: Vec<serde_json::Value> =
        (0..32).map(|_| json!({"kind": "Secret", "name": "big", "key": "value", "targetPath": "password"})).collect();
    let spec = json!({"service": "postgresql", "config": {"user": "app"}, "configFrom": entries});
    tss.create(&PostParams::default(), &taskserv("many", spec)?).await?;
    let many = wait_ts(&tss, "many", "refused: configFrom too large", |t| {
        cond(t, "Stalled").is_some_and(|c| c.0 == "True" && c.1 == "ConfigFromInvalid")
    })
    .await?;
    let message = cond(&many, "Stalled").map(|c| c.2).unwrap_or_default();
    assert!(message.contains("configFrom[1]") && message.contains("256 KiB"), "{message}");
    assert!(!message.contains("BIGVALUE"), "{message}");
    controller.stop().await;
    env.shutdown().await;
    Ok(())
}
