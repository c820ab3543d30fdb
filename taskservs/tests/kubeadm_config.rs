//! What cannot run here (kubeadm, cilium) checked as far as their published types allow:
//! every kubeadm configuration the kubernetes scripts generate — the first control plane's
//! init config (kubeadm-init.yaml rendered by the catalog), each joiner's JoinConfiguration and
//! the token renewal's InitConfiguration (both from kubernetes/common.nu, run with `nu`) — for
//! every catalog version, role and control-plane endpoint, against kubeadm's v1beta4 types
//! (fixtures/kubeadm/kubeadm-v1beta4.json); and every `--set` cilium/install.nu passes against
//! cilium's chart values schema (fixtures/kubeadm/cilium-values-schema.json).

#[path = "kubeadm_config/checker.rs"]
mod checker;
mod common;

use checker::Description;
use common::{crate_dir, fixture, nu};
use provisioning_taskservs::{AddressInfo, Catalog, ClusterInfo, PeerInfo, ScriptContext, ServerInfo, TaskServInfo, WorkspaceInfo};
use serde::Deserialize;
use serde_json::{Value, json};

fn description() -> Description {
    let text = std::fs::read_to_string(fixture("kubeadm/kubeadm-v1beta4.json")).expect("the kubeadm types fixture");
    Description::from_json(&text).unwrap_or_else(|e| panic!("{e}"))
}

fn catalog() -> Catalog {
    Catalog::load(&Catalog::default_dir()).expect("catalog loads")
}

/// The YAML documents of `text` as kubeadm splits them (empty documents skipped).
fn documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("not YAML ({e}):\n{text}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn errors_of(desc: &Description, doc: &Value) -> Vec<String> {
    desc.check_document(doc)
}

// ---------------------------------------------------------------- the checker itself

#[test]
fn the_types_description_is_complete_and_consistent() {
    let desc = description();
    assert_eq!(desc.self_check(), Vec::<String>::new());
    assert!(desc.api_versions["kubeadm.k8s.io/v1beta4"].kinds.len() == 3, "Init, Cluster and Join described");
}

/// A change made to a valid document.
type Mutation = fn(&mut Value);

fn valid_join() -> Value {
    json!({
        "apiVersion": "kubeadm.k8s.io/v1beta4",
        "kind": "JoinConfiguration",
        "discovery": {"bootstrapToken": {"apiServerEndpoint": "10.0.0.1:6443", "token": "abcdef.0123456789abcdef",
                                         "caCertHashes": [format!("sha256:{}", "a".repeat(64))]}},
        "nodeRegistration": {"name": "w-0", "criSocket": "unix:///run/containerd/containerd.sock"},
        "controlPlane": {"certificateKey": "b".repeat(64), "localAPIEndpoint": {"advertiseAddress": "10.0.0.2", "bindPort": 6443}}
    })
}

/// The checker refuses what `kubeadm config validate` refuses: each mutation of a valid
/// document is reported with its path.
#[test]
fn the_checker_refuses_typos_wrong_types_and_missing_fields() {
    let desc = description();
    assert_eq!(errors_of(&desc, &valid_join()), Vec::<String>::new());
    let cases: &[(&str, Mutation, &str)] = &[
        (
            "a typo'd field",
            |d| rename(&mut d["discovery"]["bootstrapToken"], "caCertHashes", "caCertHash"),
            "JoinConfiguration.discovery.bootstrapToken.caCertHash: unknown field",
        ),
        (
            "a typo'd top-level field",
            |d| rename(d, "nodeRegistration", "nodeRegistraton"),
            "JoinConfiguration.nodeRegistraton: unknown field",
        ),
        ("a field in the wrong case", |d| rename(d, "discovery", "Discovery"), "JoinConfiguration.Discovery: unknown field"),
        ("metadata (kubeadm's types have none)", |d| d["metadata"] = json!({"name": "x"}), "JoinConfiguration.metadata: unknown field"),
        (
            "a port as a string",
            |d| d["controlPlane"]["localAPIEndpoint"]["bindPort"] = json!("6443"),
            "bindPort: expected a 32-bit integer",
        ),
        ("a boolean as a string", |d| d["dryRun"] = json!("true"), "dryRun: expected a boolean"),
        (
            "a host name as advertiseAddress",
            |d| d["controlPlane"]["localAPIEndpoint"]["advertiseAddress"] = json!("cp-1"),
            "advertiseAddress: \"cp-1\" is not a valid ip",
        ),
        (
            "no apiServerEndpoint",
            |d| remove(&mut d["discovery"]["bootstrapToken"], "apiServerEndpoint"),
            "bootstrapToken.apiServerEndpoint: required",
        ),
        (
            "an endpoint without port",
            |d| d["discovery"]["bootstrapToken"]["apiServerEndpoint"] = json!("10.0.0.1"),
            "is not a valid hostPort",
        ),
        (
            "no CA pin",
            |d| remove(&mut d["discovery"]["bootstrapToken"], "caCertHashes"),
            "one of [\"caCertHashes\", \"unsafeSkipCAVerification\"]",
        ),
        (
            "a malformed token",
            |d| d["discovery"]["bootstrapToken"]["token"] = json!("abcdef0123456789abcdef"),
            "is not a valid bootstrapToken",
        ),
        ("a short certificate key", |d| d["controlPlane"]["certificateKey"] = json!("cafe"), "is not a valid certificateKey"),
        (
            "two discovery methods",
            |d| d["discovery"]["file"] = json!({"kubeConfigPath": "/etc/k.conf"}),
            "exactly one of [\"bootstrapToken\", \"file\"]",
        ),
        ("kubeletExtraArgs, a []Arg (accepted)", |d| d["nodeRegistration"]["kubeletExtraArgs"] = json!([{"name": "v", "value": "2"}]), ""),
        ("an older apiVersion", |d| d["apiVersion"] = json!("kubeadm.k8s.io/v1beta3"), "apiVersion \"kubeadm.k8s.io/v1beta3\" is not one"),
        ("an unknown kind", |d| d["kind"] = json!("JoinConfig"), "has no kind \"JoinConfig\""),
        ("a kind not transcribed", |d| d["kind"] = json!("ResetConfiguration"), "not transcribed"),
    ];
    for (what, mutate, want) in cases {
        let mut doc = valid_join();
        mutate(&mut doc);
        let errors = errors_of(&desc, &doc);
        if want.is_empty() {
            // kubeletExtraArgs ([]Arg) is transcribed: setting it is fine.
            assert_eq!(errors, Vec::<String>::new(), "{what}");
        } else {
            assert!(errors.iter().any(|e| e.contains(want)), "{what}: want {want:?} in {errors:#?}");
        }
    }
    // A field kubeadm has but whose content the fixture leaves opaque is refused, not waved through.
    let mut doc = valid_join();
    doc["nodeRegistration"]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}]);
    assert_eq!(errors_of(&desc, &doc), Vec::<String>::new());
    let kubelet = json!({"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "logging": {"format": "json"}});
    assert!(
        errors_of(&desc, &kubelet).iter().any(|e| e.contains("logging: its type is not transcribed")),
        "{:?}",
        errors_of(&desc, &kubelet)
    );
    // Durations as Go parses them.
    for ok in ["1h0m0s", "24h", "90s", "1.5h", "300ms", "0", "2h45m"] {
        assert!(checker::go_duration_ok(ok), "{ok}");
    }
    for bad in ["1 hour", "1d", "", "h", "10", "1h0m0"] {
        assert!(!checker::go_duration_ok(bad), "{bad}");
    }
}

fn rename(object: &mut Value, from: &str, to: &str) {
    if let Some(map) = object.as_object_mut()
        && let Some(v) = map.remove(from)
    {
        map.insert(to.to_string(), v);
    }
}

fn remove(object: &mut Value, key: &str) {
    if let Some(map) = object.as_object_mut() {
        map.remove(key);
    }
}

// ---------------------------------------------------------------- every generated config

const TOKEN: &str = "abcdef.0123456789abcdef";

/// The control-plane endpoints a Cluster can give the kubernetes service (its
/// `controlPlaneEndpoint`): none (the first control plane), a load balancer's address or DNS
/// name, a floating IP, a keepalived VIP on its own port.
const ENDPOINTS: &[(&str, &str)] = &[
    ("none", ""),
    ("LoadBalancer address", "203.0.113.10:6443"),
    ("LoadBalancer DNS name", "k8s-api-0123456789.elb.eu-north-1.amazonaws.com:6443"),
    ("FloatingIP", "198.51.100.7:6443"),
    ("VIP", "10.0.0.100:8443"),
    ("LoadBalancer IPv6 address", "[2001:db8::10]:6443"),
];

/// The Cluster: three control planes, one worker; InternalIP first, as the controller orders.
const SERVERS: &[(&str, &str, &str)] = &[
    ("cp-0", "10.0.0.1", "control-plane"),
    ("cp-1", "10.0.0.2", "control-plane"),
    ("cp-2", "10.0.0.3", "control-plane"),
    ("w-0", "10.0.0.9", "workers"),
];

/// A server's InternalIP: its IPv4 address of SERVERS, or an IPv6 one on IPv6 machines.
fn internal_ip(ip: &str, v6: bool) -> String {
    if v6 { format!("fd00::{}", ip.rsplit('.').next().unwrap_or_default()) } else { ip.to_string() }
}

fn addresses(internal: &str, n: usize) -> Vec<AddressInfo> {
    vec![
        AddressInfo { kind: "InternalIP".into(), address: internal.into() },
        AddressInfo { kind: "ExternalIP".into(), address: format!("192.0.2.{}", 10 + n) },
    ]
}

/// The script context of `server`, as the controller builds it, with templates rendered.
fn context(catalog: &Catalog, server: usize, version: &str, endpoint: &str, kube_proxy: bool, v6: bool, ca_key: &str) -> ScriptContext {
    let config = json!({"bootstrapToken": TOKEN, "certificateKey": "0f".repeat(32), "caKey": ca_key,
                        "controlPlaneEndpoint": endpoint, "kubeProxy": kube_proxy});
    let resolved = catalog.validate_request("kubernetes", Some(version), &config).unwrap_or_else(|e| panic!("{endpoint}: {e}"));
    let peer = |(i, (name, ip, pool)): (usize, &(&str, &str, &str))| PeerInfo {
        name: (*name).into(),
        addresses: addresses(&internal_ip(ip, v6), i),
        pool: (*pool).into(),
    };
    let all: Vec<PeerInfo> = SERVERS.iter().enumerate().map(peer).collect();
    let (name, ip, pool) = SERVERS[server];
    ScriptContext {
        server: ServerInfo {
            name: name.into(),
            namespace: "k8s".into(),
            addresses: addresses(&internal_ip(ip, v6), server),
            hostname: name.into(),
            pool: pool.into(),
        },
        peers: all.iter().filter(|p| p.name != name).cloned().collect(),
        cluster: ClusterInfo { name: "k8s".into(), servers: all },
        workspace: WorkspaceInfo { name: "k8s".into(), environment: "prod".into(), config: json!({}) },
        taskserv: TaskServInfo {
            name: "k8s-kubernetes".into(),
            service: "kubernetes".into(),
            version: resolved.version,
            previous_version: None,
        },
        config: resolved.config,
        templates: Default::default(),
    }
    .with_templates(catalog)
    .unwrap_or_else(|e| panic!("render: {e}"))
}

fn ca_key(dir: &std::path::Path) -> String {
    let key = dir.join("ca.key");
    let out = std::process::Command::new("openssl")
        .args(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out"])
        .arg(&key)
        .output()
        .expect("openssl runs (installed by scripts/setup.sh)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::read_to_string(key).expect("key")
}

/// What kubernetes/common.nu makes of each context: its role, its JoinConfiguration (what
/// install.nu writes on a joiner) and the token renewal's InitConfiguration (what the first
/// control plane's check writes), plus the CA hash joiners pin.
#[derive(Deserialize)]
struct Generated {
    hash: String,
    roles: Vec<String>,
    /// "" for the first control plane (it inits).
    joins: Vec<String>,
    tokens: Vec<String>,
    /// {host, port} install.nu waits for before joining.
    endpoints: Vec<Value>,
}

fn generate(contexts: &[ScriptContext]) -> Generated {
    let script = r#"use kubernetes/common.nu *
let ctxs = ($in | from json)
let hash = (ca-cert-hash ($ctxs | first | get config.caKey))
{
    hash: $hash
    roles: ($ctxs | each {|c| role $c })
    joins: ($ctxs | each {|c| if (role $c) == "init" { "" } else { join-config-for $c $hash } })
    tokens: ($ctxs | each {|c| token-config $c })
    endpoints: ($ctxs | each {|c| try { split-endpoint (api-endpoint $c) } catch {|e| {error: $e.msg} } })
} | to json --raw"#;
    let out = nu_with_stdin(script, &serde_json::to_string(contexts).expect("contexts serialize"));
    serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out)))
}

/// Runs `script` with `input` on its stdin (contexts are too large for the environment).
fn nu_with_stdin(script: &str, input: &str) -> Vec<u8> {
    use std::io::Write;
    let mut child = std::process::Command::new(nu())
        .current_dir(crate_dir().join("catalog"))
        .args(["--no-config-file", "--stdin", "-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("nu runs");
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    let out = child.wait_with_output().expect("nu output");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

fn kind_of<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in {docs:#?}"))
}

/// Every kubeadm configuration the scripts generate, for each catalog version, each
/// kube-proxy setting, each control-plane endpoint and each role, is valid against kubeadm's
/// v1beta4 types, and the configs agree with each other (joiners reach the endpoint the
/// cluster was initialised with, with its token and certificate key).
#[test]
#[allow(clippy::too_many_lines)] // one table of expectations per generated config, read top to bottom
fn every_generated_kubeadm_config_is_valid_v1beta4() {
    let desc = description();
    let catalog = catalog();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_key = ca_key(dir.path());
    let versions = catalog.get("kubernetes").expect("kubernetes in the catalog").manifest.versions.clone();
    assert!(versions.len() >= 2, "{versions:?}");

    let mut variants = Vec::new();
    for version in &versions {
        for kube_proxy in [true, false] {
            for (label, endpoint) in ENDPOINTS {
                for v6 in [false, true] {
                    let contexts: Vec<ScriptContext> =
                        (0..SERVERS.len()).map(|i| context(&catalog, i, version, endpoint, kube_proxy, v6, &ca_key)).collect();
                    let machines = if v6 { "IPv6" } else { "IPv4" };
                    variants.push((
                        format!("{version} kubeProxy={kube_proxy} endpoint={label} machines={machines}"),
                        *endpoint,
                        kube_proxy,
                        v6,
                        contexts,
                    ));
                }
            }
        }
    }
    let all: Vec<ScriptContext> = variants.iter().flat_map(|v| v.4.clone()).collect();
    let generated = generate(&all);
    assert!(generated.hash.starts_with("sha256:"), "{}", generated.hash);

    // First what kubeadm would refuse, every document of every generated config...
    let mut checked = 0;
    let mut problems = Vec::new();
    for (n, (label, _, _, _, contexts)) in variants.iter().enumerate() {
        let base = n * SERVERS.len();
        let mut texts = vec![(format!("{label} init (kubeadm-init.yaml)"), contexts[0].templates["kubeadm-init.yaml"].clone())];
        for (i, (name, _, _)) in SERVERS.iter().enumerate().skip(1) {
            texts.push((format!("{label} join of {name} ({})", generated.roles[base + i]), generated.joins[base + i].clone()));
        }
        texts.push((format!("{label} token renewal (token-config)"), generated.tokens[base].clone()));
        for (what, text) in texts {
            for doc in documents(&text) {
                checked += 1;
                problems.extend(desc.check_document(&doc).into_iter().map(|e| format!("{what}: {e}")));
            }
        }
    }
    assert_eq!(problems, Vec::<String>::new());
    // Init (3 documents) + 3 joins + 1 token config, for every variant: nothing left out.
    assert_eq!(checked, variants.len() * 7);
    assert_eq!(variants.len(), versions.len() * 2 * ENDPOINTS.len() * 2);

    // ...then that they agree with each other and with the Cluster.
    for (n, (label, endpoint, kube_proxy, v6, contexts)) in variants.iter().enumerate() {
        let base = n * SERVERS.len();
        let roles = &generated.roles[base..base + SERVERS.len()];
        assert_eq!(roles, ["init", "control-plane", "control-plane", "worker"], "{label}");

        // The first control plane: kubeadm-init.yaml as the catalog renders it.
        let init = documents(&contexts[0].templates["kubeadm-init.yaml"]);
        assert_eq!(init.len(), 3, "{label}: Init, Cluster and Kubelet configurations");
        let (init_cfg, cluster) = (kind_of(&init, "InitConfiguration"), kind_of(&init, "ClusterConfiguration"));
        let first = internal_ip("10.0.0.1", *v6);
        let api = match (endpoint.is_empty(), v6) {
            (false, _) => endpoint.to_string(),
            (true, false) => format!("{first}:6443"),
            (true, true) => format!("[{first}]:6443"),
        };
        // install.nu waits for the endpoint's host and port before joining.
        let (host, port) = api.rsplit_once(':').expect("host:port");
        let want = json!({"host": host.trim_start_matches('[').trim_end_matches(']'), "port": port.parse::<u16>().expect("port")});
        for i in 0..SERVERS.len() {
            assert_eq!(generated.endpoints[base + i], want, "{label}: split-endpoint of {api}");
        }
        assert_eq!(cluster["controlPlaneEndpoint"], api, "{label}");
        assert_eq!(cluster["kubernetesVersion"], format!("v{}", contexts[0].taskserv.version), "{label}");
        assert_eq!(init_cfg["nodeRegistration"]["name"], "cp-0", "{label}");
        assert_eq!(init_cfg["localAPIEndpoint"]["advertiseAddress"], first, "{label}: the InternalIP");
        assert_eq!(init_cfg["bootstrapTokens"][0]["token"], TOKEN, "{label}");
        let skips_proxy = init_cfg["skipPhases"].as_array().is_some_and(|p| p.contains(&json!("addon/kube-proxy")));
        assert_eq!(skips_proxy, !kube_proxy, "{label}: kube-proxy skipped exactly when a CNI replaces it");
        assert_eq!(kind_of(&init, "KubeletConfiguration")["cgroupDriver"], "systemd", "{label}");

        // Every joiner: its JoinConfiguration reaches the same endpoint with the same secrets.
        for (i, (name, ip, _)) in SERVERS.iter().enumerate().skip(1) {
            let text = &generated.joins[base + i];
            assert!(!text.is_empty(), "{label}: no join config for {name}");
            let join = documents(text);
            let join = &join[0];
            let discovery = &join["discovery"]["bootstrapToken"];
            assert_eq!(discovery["apiServerEndpoint"], api, "{label} {name}: the endpoint the cluster was initialised with");
            assert_eq!(discovery["token"], init_cfg["bootstrapTokens"][0]["token"], "{label} {name}");
            assert_eq!(discovery["caCertHashes"], json!([generated.hash]), "{label} {name}");
            assert_eq!(join["nodeRegistration"]["name"], *name, "{label}");
            if roles[i] == "control-plane" {
                assert_eq!(join["controlPlane"]["certificateKey"], init_cfg["certificateKey"], "{label} {name}");
                assert_eq!(
                    join["controlPlane"]["localAPIEndpoint"]["advertiseAddress"],
                    internal_ip(ip, *v6),
                    "{label} {name}: the InternalIP"
                );
            } else {
                assert!(join.get("controlPlane").is_none(), "{label} {name}: a worker is no control plane");
            }
        }
        assert!(generated.joins[base].is_empty(), "{label}: the first control plane inits, it does not join");

        // The token renewal (first control plane's check): same token, one hour.
        let token = documents(&generated.tokens[base]);
        let token = kind_of(&token, "InitConfiguration");
        assert_eq!(token["bootstrapTokens"][0]["token"], TOKEN, "{label}");
        assert_eq!(token["bootstrapTokens"][0]["ttl"], "1h0m0s", "{label}");
        assert_eq!(token["certificateKey"], init_cfg["certificateKey"], "{label}");
    }
}

/// A typo in a generated config is found: the worker's real JoinConfiguration with one field
/// misspelled fails the check (the check above would fail the same way on such a script).
#[test]
fn a_typo_in_a_generated_config_fails_the_check() {
    let desc = description();
    let catalog = catalog();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca_key = ca_key(dir.path());
    let contexts: Vec<ScriptContext> = (0..SERVERS.len()).map(|i| context(&catalog, i, "1.31.4", "", true, false, &ca_key)).collect();
    let generated = generate(&contexts);
    let worker = generated.joins[3].clone();
    let mut doc = documents(&worker).remove(0);
    assert_eq!(desc.check_document(&doc), Vec::<String>::new());
    rename(&mut doc["nodeRegistration"], "criSocket", "criSock");
    let errors = desc.check_document(&doc);
    assert!(errors.iter().any(|e| e.contains("JoinConfiguration.nodeRegistration.criSock: unknown field")), "{errors:#?}");
    let typo = worker.replace("\"caCertHashes\"", "\"caCertHash\"");
    let errors = desc.check_document(&documents(&typo)[0]);
    assert!(errors.iter().any(|e| e.contains("caCertHash: unknown field")), "{errors:#?}");
    assert!(errors.iter().any(|e| e.contains("one of [\"caCertHashes\"")), "{errors:#?}");
}

// ---------------------------------------------------------------- cilium's chart values

/// The facts of one cilium minor's chart schema (see the fixture's `_about`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChartFacts {
    root_additional_properties: bool,
    declared: std::collections::BTreeMap<String, Vec<String>>,
    undeclared_read_by_templates: std::collections::BTreeMap<String, Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CiliumFacts {
    minors: std::collections::BTreeMap<String, ChartFacts>,
    ipam_modes: Vec<String>,
}

/// A `--set` value as Helm's strvals parses it: true/false → boolean, an integer → integer,
/// null → null, anything else → string.
fn helm_value(text: &str) -> Value {
    match text {
        "true" => json!(true),
        "false" => json!(false),
        "null" => Value::Null,
        _ => text.parse::<i64>().map(Value::from).unwrap_or_else(|_| json!(text)),
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Problems of `--set key=value` pairs against one minor's chart facts.
fn check_settings(facts: &ChartFacts, ipam_modes: &[String], args: &[String]) -> Vec<String> {
    let mut errors = Vec::new();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let Some(pair) = it.next().filter(|_| flag == "--set") else {
            errors.push(format!("{flag}: only `--set key=value` pairs are checked"));
            continue;
        };
        let Some((key, raw)) = pair.split_once('=') else {
            errors.push(format!("--set {pair}: no `=`"));
            continue;
        };
        let value = helm_value(raw);
        if let Some(types) = facts.declared.get(key) {
            let ty = json_type(&value);
            // JSON Schema: an integer is also a number.
            if !types.iter().any(|t| t == ty || (t == "number" && ty == "integer")) {
                errors.push(format!("{key}={raw}: the schema wants {types:?}, Helm parses {ty}"));
            }
            let mut parent = key;
            while let Some((up, _)) = parent.rsplit_once('.') {
                if facts.declared.get(up).is_none_or(|t| !t.iter().any(|t| t == "object")) {
                    errors.push(format!("{key}: its parent {up} is not an object in the schema"));
                }
                parent = up;
            }
        } else if let Some(accepted) = facts.undeclared_read_by_templates.get(key) {
            let rendered = match &value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if key.contains('.') || !facts.root_additional_properties {
                errors.push(format!("{key}: not declared, and the schema would refuse it there"));
            } else if !accepted.contains(&rendered) {
                errors.push(format!("{key}={raw}: the chart's templates accept only {accepted:?}"));
            }
        } else {
            errors.push(format!("{key}: not a value of the chart (not in its schema, not read by its templates)"));
        }
        if key == "ipam.mode" && !value.as_str().is_some_and(|m| ipam_modes.iter().any(|k| k == m)) {
            errors.push(format!("ipam.mode={raw}: not an IPAM mode cilium knows ({ipam_modes:?})"));
        }
    }
    errors
}

fn cilium_facts() -> CiliumFacts {
    let text = std::fs::read_to_string(fixture("kubeadm/cilium-values-schema.json")).expect("the cilium fixture");
    serde_json::from_str(&text).expect("the cilium fixture parses")
}

/// For every catalog cilium version and every config the catalog allows (kubeProxyReplacement
/// true/false, each ipamMode of its enum), the `--set` values install.nu passes exist in that
/// minor's chart with a compatible type; a misspelt key or an unknown mode would not pass.
#[test]
fn cilium_install_sets_only_values_the_chart_knows() {
    let facts = cilium_facts();
    let catalog = catalog();
    let cilium = &catalog.get("cilium").expect("cilium in the catalog").manifest;
    let modes: Vec<String> = cilium.config_schema["properties"]["ipamMode"]["enum"]
        .as_array()
        .expect("ipamMode has an enum")
        .iter()
        .filter_map(|m| m.as_str().map(String::from))
        .collect();
    let configs: Vec<Value> =
        [true, false].iter().flat_map(|kpr| modes.iter().map(move |m| json!({"kubeProxyReplacement": kpr, "ipamMode": m}))).collect();
    let out = nu_with_stdin(
        "use cilium/common.nu *; $in | from json | each {|c| helm-settings $c } | to json --raw",
        &serde_json::to_string(&configs).expect("json"),
    );
    let settings: Vec<Vec<String>> = serde_json::from_slice(&out).expect("settings");
    assert_eq!(settings.len(), configs.len());
    let mut checked = 0;
    for version in &cilium.versions {
        let minor = version.split('.').take(2).collect::<Vec<_>>().join(".");
        let chart = facts
            .minors
            .get(&minor)
            .unwrap_or_else(|| panic!("cilium {version}: no chart schema facts for {minor} in the fixture; add them"));
        for (config, args) in configs.iter().zip(&settings) {
            assert!(args.len() >= 4, "{args:?}");
            assert_eq!(check_settings(chart, &facts.ipam_modes, args), Vec::<String>::new(), "cilium {version} {config}");
            checked += 1;
        }
    }
    assert_eq!(checked, cilium.versions.len() * 2 * modes.len());

    // The check is not a rubber stamp.
    let chart = &facts.minors["1.16"];
    let set = |pair: &str| vec!["--set".to_string(), pair.to_string()];
    for (pair, want) in [
        ("ipam.mod=kubernetes", "not a value of the chart"),
        ("kubeProxyReplacment=true", "not a value of the chart"),
        ("ipam.mode=hostscope", "not an IPAM mode"),
        ("kubeProxyReplacement=strict", "accept only"),
        ("k8sServicePort=true", "the schema wants"),
    ] {
        let errors = check_settings(chart, &facts.ipam_modes, &set(pair));
        assert!(errors.iter().any(|e| e.contains(want)), "{pair}: {errors:?}");
    }
}
