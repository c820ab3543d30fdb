//! Templates rendered from the script context.

use provisioning_taskservs::{
    AddressInfo, Catalog, ClusterInfo, PeerInfo, ScriptContext, ServerInfo, TaskServInfo, TemplateError, WorkspaceInfo,
};
use serde_json::json;

fn catalog() -> Catalog {
    Catalog::load(&Catalog::default_dir()).expect("catalog loads")
}

fn ip(addr: &str) -> Vec<AddressInfo> {
    vec![AddressInfo { kind: "InternalIP".into(), address: addr.into() }]
}

fn peer(name: &str, addr: &str, pool: &str) -> PeerInfo {
    PeerInfo { name: name.into(), addresses: ip(addr), pool: pool.into() }
}

fn context(service: &str, server: (&str, &str), peers: Vec<PeerInfo>, config: serde_json::Value) -> ScriptContext {
    let catalog = catalog();
    let resolved = catalog.validate_request(service, None, &config).expect("valid config");
    ScriptContext {
        server: ServerInfo {
            name: server.0.into(),
            namespace: "dev".into(),
            addresses: ip(server.1),
            hostname: server.0.into(),
            pool: String::new(),
        },
        peers,
        cluster: ClusterInfo { name: "etcd".into(), servers: vec![] },
        workspace: WorkspaceInfo { name: "dev".into(), environment: "dev".into(), config: json!({}) },
        taskserv: TaskServInfo {
            name: format!("{service}-ts"),
            service: service.into(),
            version: resolved.version,
            previous_version: None,
        },
        config: resolved.config,
        templates: Default::default(),
    }
}

#[test]
fn etcd_initial_cluster_lists_every_member_in_name_order() {
    let peers = vec![peer("etcd-2", "10.0.0.12", ""), peer("etcd-0", "10.0.0.10", "")];
    let ctx = context("etcd", ("etcd-1", "10.0.0.11"), peers, json!({})).with_templates(&catalog()).expect("render");
    let conf = &ctx.templates["etcd.conf.yml"];
    let yaml: serde_json::Value = serde_yaml_ng::from_str(conf).unwrap_or_else(|e| panic!("{e}:\n{conf}"));
    assert_eq!(yaml["name"], "etcd-1");
    assert_eq!(yaml["initial-cluster"], "etcd-0=https://10.0.0.10:2380,etcd-1=https://10.0.0.11:2380,etcd-2=https://10.0.0.12:2380");
    assert_eq!(yaml["advertise-client-urls"], "https://10.0.0.11:2379");
    // TLS with client certificates for clients and peers; the private address, never 0.0.0.0.
    assert_eq!(yaml["listen-client-urls"], "https://10.0.0.11:2379,https://127.0.0.1:2379");
    assert_eq!(yaml["listen-peer-urls"], "https://10.0.0.11:2380");
    for section in ["client-transport-security", "peer-transport-security"] {
        assert_eq!(yaml[section]["client-cert-auth"], true, "{conf}");
        assert_eq!(yaml[section]["trusted-ca-file"], "/etc/etcd/pki/ca.crt", "{conf}");
    }
    assert!(!conf.contains("0.0.0.0") && !conf.contains("http://"), "{conf}");
    assert_eq!(yaml["initial-cluster-token"], "etcd-etcd");
    assert_eq!(yaml["initial-cluster-state"], "new");
}

#[test]
fn haproxy_backends_from_pool_peers_or_config() {
    // From the Cluster's servers of a pool (this server excluded).
    let mut ctx = context("haproxy", ("lb-0", "10.0.0.2"), vec![], json!({"backendPool": "web", "backendPort": 8080}));
    ctx.cluster.servers = vec![peer("lb-0", "10.0.0.2", "lb"), peer("web-0", "10.0.0.20", "web"), peer("web-1", "10.0.0.21", "web")];
    let cfg = catalog().render_templates("haproxy", &ctx.template_values()).expect("render")["haproxy.cfg"].clone();
    assert!(cfg.contains("server web-0 10.0.0.20:8080 check"), "{cfg}");
    assert!(cfg.contains("server web-1 10.0.0.21:8080 check"), "{cfg}");
    assert!(!cfg.contains("server lb-0"), "{cfg}");
    // From explicit backends.
    let ctx =
        context("haproxy", ("lb-0", "10.0.0.2"), vec![], json!({"backends": [{"name": "api", "address": "192.0.2.1", "port": 9000}]}));
    let cfg = catalog().render_templates("haproxy", &ctx.template_values()).expect("render")["haproxy.cfg"].clone();
    assert!(cfg.contains("server api 192.0.2.1:9000 check"), "{cfg}");
    // From the peers.
    let ctx = context("haproxy", ("lb-0", "10.0.0.2"), vec![peer("lb-1", "10.0.0.3", "")], json!({}));
    let cfg = catalog().render_templates("haproxy", &ctx.template_values()).expect("render")["haproxy.cfg"].clone();
    assert!(cfg.contains("server lb-1 10.0.0.3:80 check"), "{cfg}");
}

#[test]
fn every_shipped_template_renders_with_defaults() {
    let catalog = catalog();
    let k8s = json!({"bootstrapToken": "abcdef.0123456789abcdef", "certificateKey": "b".repeat(64),
            "caKey": "-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n"});
    for service in catalog.services() {
        let name = service.name();
        // The required fields (secrets the controller generates, keepalived's address).
        let config = match name {
            "kubernetes" => k8s.clone(),
            "docker-registry" => json!({"password": "p4ssword"}),
            "webhook" => json!({"secret": "0123456789abcdef"}),
            "prometheus" | "alertmanager" => json!({"webPassword": "p4ssword"}),
            "keepalived" => json!({"virtualAddress": "10.0.0.100/24", "authPassword": "p4ssword"}),
            _ => json!({}),
        };
        let ctx = context(name, ("node-0", "10.0.0.1"), vec![peer("node-1", "10.0.0.2", "")], config);
        let rendered = catalog.render_templates(name, &ctx.template_values()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(rendered.len(), service.templates.len(), "{name}");
    }
}

#[test]
fn undefined_variables_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    std::fs::create_dir_all(root.join("svc/templates")).expect("mkdir");
    std::fs::write(
        root.join("svc/taskserv.yaml"),
        "name: svc\ndescription: d\nversions: [\"1\"]\ndefaultVersion: \"1\"\nproviders: [local]\n",
    )
    .expect("write");
    for f in ["install.nu", "check.nu", "remove.nu"] {
        std::fs::write(root.join("svc").join(f), "def main [] {}\n").expect("write");
    }
    std::fs::write(root.join("svc/templates/a.conf"), "port {{ config.prot }}\n").expect("write");
    let catalog = Catalog::load(root).expect("load");
    let mut ctx = ScriptContext::default();
    ctx.taskserv.service = "svc".into();
    ctx.config = json!({"port": 1});
    let err = catalog.render_templates("svc", &ctx.template_values()).expect_err("undefined");
    assert!(matches!(err, TemplateError::Render { ref template, .. } if template == "a.conf"), "{err}");
}

#[test]
fn context_serialises_with_camel_case_fields() {
    let mut ctx = context("redis", ("r-0", "10.0.0.5"), vec![], json!({}));
    ctx.taskserv.previous_version = Some("7.0".into());
    let v = serde_json::to_value(&ctx).expect("json");
    assert_eq!(v["taskserv"]["previousVersion"], "7.0");
    assert_eq!(v["server"]["addresses"][0]["type"], "InternalIP");
    assert_eq!(v["workspace"]["environment"], "dev");
    let back: ScriptContext = serde_json::from_value(v).expect("round trip");
    assert_eq!(back, ctx);
}

#[test]
fn provider_addresses_must_be_ips_in_config_files() {
    // A provider-reported "address" that is not an IP is refused, not written into the file.
    for hostile in ["10.0.0.1\n    stats enable", "evil.example", "10.0.0.1 backup", ""] {
        let ctx = context("haproxy", ("lb-0", "10.0.0.2"), vec![peer("web-0", hostile, "")], json!({}));
        let err = catalog().render_templates("haproxy", &ctx.template_values()).expect_err(hostile);
        assert!(err.to_string().contains("not an IP address"), "{err}");
        let ctx = context("etcd", ("etcd-0", "10.0.0.10"), vec![peer("etcd-1", hostile, "")], json!({}));
        assert!(catalog().render_templates("etcd", &ctx.template_values()).is_err(), "{hostile:?}");
    }
    // IPv6 goes in brackets where a port follows.
    let ctx = context("haproxy", ("lb-0", "fd00::2"), vec![peer("web-0", "fd00::20", "")], json!({}));
    let cfg = catalog().render_templates("haproxy", &ctx.template_values()).expect("render")["haproxy.cfg"].clone();
    assert!(cfg.contains("server web-0 [fd00::20]:80 check") && cfg.contains("bind [fd00::2]:80"), "{cfg}");
}

#[test]
fn services_bind_private_addresses_and_keep_stats_local() {
    let ctx = context("haproxy", ("lb-0", "10.0.0.2"), vec![peer("web-0", "10.0.0.20", "")], json!({}));
    let cfg = catalog().render_templates("haproxy", &ctx.template_values()).expect("render")["haproxy.cfg"].clone();
    assert!(cfg.contains("bind 10.0.0.2:80\n    bind 127.0.0.1:80\n"), "{cfg}");
    assert!(cfg.contains("bind 127.0.0.1:8404\n"), "{cfg}");
    assert!(!cfg.contains("10.0.0.2:8404") && !cfg.contains("*:"), "{cfg}");
    let ctx = context("haproxy", ("lb-0", "10.0.0.2"), vec![], json!({"statsBind": "private"}));
    let cfg = catalog().render_templates("haproxy", &ctx.template_values()).expect("render")["haproxy.cfg"].clone();
    assert!(cfg.contains("bind 127.0.0.1:8404\n    bind 10.0.0.2:8404\n"), "{cfg}");

    let ctx = context("redis", ("r-0", "10.0.0.5"), vec![], json!({"password": "pw"}));
    let conf = catalog().render_templates("redis", &ctx.template_values()).expect("render")["redis.conf"].clone();
    assert!(conf.contains("\nbind 10.0.0.5 127.0.0.1\n") && conf.contains("\nprotected-mode yes\n"), "{conf}");

    let ctx = context("postgresql", ("pg-0", "10.0.0.7"), vec![peer("pg-1", "10.0.0.8", "")], json!({}));
    let rendered = catalog().render_templates("postgresql", &ctx.template_values()).expect("render");
    let hba = &rendered["pg_hba.conf"];
    assert!(hba.contains("10.0.0.7/32") && hba.contains("10.0.0.8/32"), "{hba}");
    assert!(!hba.contains("0.0.0.0/0"), "{hba}");
    assert!(rendered["provisioning.conf"].contains("listen_addresses = '10.0.0.7,localhost'"), "{}", rendered["provisioning.conf"]);
}

#[test]
fn a_hostile_redis_password_stays_one_quoted_argument() {
    let hostile = "p$(reboot); rm -rf / '\"`x`\nline2\\";
    let ctx = context("redis", ("r-0", "10.0.0.5"), vec![], json!({"password": hostile}));
    let conf = catalog().render_templates("redis", &ctx.template_values()).expect("render")["redis.conf"].clone();
    let line = conf.lines().find(|l| l.starts_with("requirepass ")).unwrap_or_else(|| panic!("{conf}"));
    assert_eq!(line, r#"requirepass "p$(reboot); rm -rf / '\"`x`\x0aline2\\""#);
    assert!(!conf.contains("\nline2"), "the newline must not start a directive: {conf}");
}

#[test]
fn prometheus_scrapes_the_clusters_node_exporters_and_sends_to_its_alertmanagers() {
    let catalog = catalog();
    let config = json!({"webPassword": "p4ssword", "alertmanagerPool": "control", "alertmanagerPassword": "am-pass\"word"});
    let mut ctx = context("prometheus", ("mon-0", "10.0.0.1"), vec![], config);
    ctx.cluster.servers = vec![peer("mon-0", "10.0.0.1", "control"), peer("app-1", "10.0.0.3", "apps"), peer("app-0", "10.0.0.2", "apps")];
    let conf = catalog.render_templates("prometheus", &ctx.template_values()).expect("render")["prometheus.yml"].clone();
    let yaml: serde_json::Value = serde_yaml_ng::from_str(&conf).unwrap_or_else(|e| panic!("{e}:\n{conf}"));
    // Every server of the Cluster, sorted by name, labelled with its server name.
    let targets: Vec<String> = yaml["scrape_configs"][0]["static_configs"]
        .as_array()
        .expect("static")
        .iter()
        .map(|s| s["targets"][0].as_str().expect("t").to_string())
        .collect();
    assert_eq!(targets, ["10.0.0.2:9100", "10.0.0.3:9100", "10.0.0.1:9100"]);
    assert_eq!(yaml["scrape_configs"][0]["static_configs"][0]["labels"]["server"], "app-0");
    let am = &yaml["alerting"]["alertmanagers"][0];
    assert_eq!(am["static_configs"][0]["targets"], json!(["10.0.0.1:9093"]));
    // The password arrives literally (JSON-quoted in YAML).
    assert_eq!(am["basic_auth"]["password"], "am-pass\"word");
    // Limited to a pool when asked.
    let mut ctx = context("prometheus", ("mon-0", "10.0.0.1"), vec![], json!({"webPassword": "p4ssword", "nodeExporterPool": "apps"}));
    ctx.cluster.servers = vec![peer("mon-0", "10.0.0.1", "control"), peer("app-0", "10.0.0.2", "apps")];
    let conf = catalog.render_templates("prometheus", &ctx.template_values()).expect("render")["prometheus.yml"].clone();
    assert!(conf.contains("\"10.0.0.2:9100\"") && !conf.contains("10.0.0.1:9100") && !conf.contains("alerting:"), "{conf}");
}

#[test]
fn nginx_fronts_the_servers_of_a_pool_by_name() {
    let catalog = catalog();
    let mut ctx = context("nginx", ("lb-0", "10.0.0.1"), vec![], json!({"upstreamPool": "registry", "upstreamPort": 5000}));
    ctx.cluster.servers =
        vec![peer("lb-0", "10.0.0.1", "edge"), peer("reg-0", "10.0.0.5", "registry"), peer("reg-1", "10.0.0.6", "registry")];
    let conf = catalog.render_templates("nginx", &ctx.template_values()).expect("render")["nginx.conf"].clone();
    assert!(conf.contains("server 10.0.0.5:5000;") && conf.contains("server 10.0.0.6:5000;"), "{conf}");
    assert!(conf.contains("listen 10.0.0.1:80;") && conf.contains("listen 127.0.0.1:80;") && !conf.contains("listen 80"), "{conf}");
    // No upstream: nginx still answers /healthz and says so on /.
    let ctx = context("nginx", ("lb-0", "10.0.0.1"), vec![], json!({}));
    let conf = catalog.render_templates("nginx", &ctx.template_values()).expect("render")["nginx.conf"].clone();
    assert!(!conf.contains("upstream fronted") && conf.contains("no upstream configured"), "{conf}");
}

#[test]
fn webhook_hooks_all_require_the_secret() {
    let catalog = catalog();
    let secret = "s3cret\"with'quotes";
    let ctx = context(
        "webhook",
        ("hooks-0", "10.0.0.1"),
        vec![],
        json!({"secret": secret, "hooks": [{"id": "deploy", "command": "/usr/local/bin/deploy"}]}),
    );
    let text = catalog.render_templates("webhook", &ctx.template_values()).expect("render")["hooks.json"].clone();
    let hooks: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    let hooks = hooks.as_array().expect("array");
    assert_eq!(hooks.iter().map(|h| h["id"].as_str().expect("id")).collect::<Vec<_>>(), ["provisioning-health", "deploy"]);
    for h in hooks {
        assert_eq!(h["trigger-rule"]["match"]["value"], secret);
        assert_eq!(h["trigger-rule"]["match"]["parameter"]["name"], "X-Webhook-Secret");
        assert_eq!(h["trigger-rule-mismatch-http-response-code"], 403);
    }
}
