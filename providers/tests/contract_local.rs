//! The provider contract suite against the local (Docker) provider, plus its own properties:
//! networks per cluster, limits, peer names, exec streaming/timeouts/stdin, clean deletes.
//!
//! Needs a Docker engine and `nu` (scripts/setup.sh provides both). Without them these tests
//! fail, never skip. The node image is built first when missing (minutes the first time,
//! then cached by recipe hash).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::{ListContainersOptions, ListNetworksOptions, ListVolumesOptions};
use provisioning_providers::contract::{ContractOptions, run};
use provisioning_providers::local::connect;
use provisioning_providers::local::image::{NodeImageOptions, build_node_image};
use provisioning_providers::{
    DeleteOutcome, ExecRequest, ExecResult, MachineState, ProviderConfig, ProviderError, ProviderId, ServerIdentity, ServerObservation,
    ServerRequest, SharedProvider, build_provider, tags,
};
use tokio::sync::OnceCell;

const SETUP_HINT: &str = "run scripts/setup.sh (installs and starts Docker, installs nu and debootstrap)";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The engine, or a failure telling how to get one.
async fn docker() -> Docker {
    let docker = match connect("").await {
        Ok(d) => d,
        Err(e) => panic!("Docker is not available ({e}); {SETUP_HINT}"),
    };
    if let Err(e) = docker.ping().await {
        panic!("Docker does not answer ({e}); {SETUP_HINT}");
    }
    docker
}

/// Builds the node image once per test process (cached by tag across runs).
async fn node_image() -> String {
    static IMAGE: OnceCell<String> = OnceCell::const_new();
    IMAGE
        .get_or_init(|| async {
            docker().await;
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let printer = tokio::spawn(async move {
                while let Some(line) = rx.recv().await {
                    eprintln!("image build: {line}");
                }
            });
            let started = Instant::now();
            let opts = NodeImageOptions { progress: Some(tx), ..Default::default() };
            let tag = match build_node_image(&opts).await {
                Ok(tag) => tag,
                Err(e) => panic!("building the node image failed: {e}; {SETUP_HINT}"),
            };
            drop(opts);
            let _ = printer.await;
            eprintln!("node image {tag} ready in {:?}", started.elapsed());
            tag
        })
        .await
        .clone()
}

fn nu_binary() -> PathBuf {
    let path = std::env::var_os("PROVISIONING_NU").map(PathBuf::from).unwrap_or_else(|| repo_root().join(".tools/bin/nu"));
    assert!(path.is_file(), "nu not found at {}; {SETUP_HINT}", path.display());
    path.canonicalize().unwrap_or(path)
}

/// A namespace no other test (or run) uses.
fn unique_namespace(test: &str) -> String {
    format!("lt-{test}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// Removes everything labelled with the namespace when dropped, even after a failed
/// assertion (through the Docker CLI: a drop cannot await).
struct Cleanup {
    namespace: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let docker = std::env::var("PROVISIONING_DOCKER").unwrap_or_else(|_| "docker".into());
        let filter = format!("label={}={}", tags::NAMESPACE, self.namespace);
        let ids = |args: &[&str]| -> Vec<String> {
            std::process::Command::new(&docker)
                .args(args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect())
                .unwrap_or_default()
        };
        let containers = ids(&["ps", "-aq", "--filter", &filter]);
        if !containers.is_empty() {
            let _ = std::process::Command::new(&docker).args(["rm", "-f", "-v"]).args(&containers).output();
        }
        let networks = ids(&["network", "ls", "-q", "--filter", &filter]);
        if !networks.is_empty() {
            let _ = std::process::Command::new(&docker).args(["network", "rm"]).args(&networks).output();
        }
    }
}

struct Fixture {
    provider: SharedProvider,
    namespace: String,
    catalog: tempfile::TempDir,
    _cleanup: Cleanup,
}

async fn fixture(test: &str) -> Fixture {
    node_image().await;
    let namespace = unique_namespace(test);
    let catalog = tempfile::tempdir().expect("tempdir");
    std::fs::write(catalog.path().join("marker.txt"), "catalog").expect("write marker");
    let config = ProviderConfig {
        name: "local-test".into(),
        provider_type: "local".into(),
        nu_binary: Some(nu_binary()),
        catalog_dir: Some(catalog.path().to_path_buf()),
        ..Default::default()
    };
    let provider = build_provider(&config).expect("build the local provider");
    Fixture { provider, _cleanup: Cleanup { namespace: namespace.clone() }, namespace, catalog }
}

impl Fixture {
    fn request(&self, name: &str, cluster: Option<&str>, plan: &str) -> ServerRequest {
        ServerRequest {
            identity: ServerIdentity {
                uid: uuid::Uuid::new_v4().to_string(),
                namespace: self.namespace.clone(),
                name: name.into(),
                cluster: cluster.map(str::to_string),
            },
            plan: plan.into(),
            zone: String::new(),
            image: "debian-12".into(),
            ssh_public_key: None,
            extra_tags: BTreeMap::new(),
            instance_profile: String::new(),
            public_ip: None,
            disks: Vec::new(),
            host_key: None,
        }
    }

    /// The request that made an observed machine (for waiting on it).
    fn request_for(&self, obs: &ServerObservation) -> ServerRequest {
        let tag = |k: &str| obs.tags.get(k).cloned().unwrap_or_default();
        ServerRequest {
            identity: ServerIdentity {
                uid: tag(tags::SERVER_UID),
                namespace: tag(tags::NAMESPACE),
                name: tag(tags::SERVER),
                cluster: obs.tags.get(tags::CLUSTER).cloned(),
            },
            ..self.request("unused", None, "small")
        }
    }

    /// Creates a server and waits (with a deadline) until it runs with an address.
    async fn running(&self, request: &ServerRequest) -> ServerObservation {
        let first = self.provider.ensure_server(request).await.expect("ensure_server");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let obs = self.provider.observe_server(&first.provider_id).await.expect("observe").expect("exists");
            if obs.state == MachineState::Running && obs.addresses.iter().any(|a| a.kind == "InternalIP") {
                return obs;
            }
            assert!(Instant::now() < deadline, "{} not running: {obs:?}", request.identity.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn exec(&self, id: &ProviderId, argv: &[&str], stdin: Option<&[u8]>, timeout: Duration) -> ExecResult {
        let request = ExecRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            stdin: stdin.map(<[u8]>::to_vec),
            env: BTreeMap::new(),
            timeout,
            output: None,
            ssh_key: None,
        };
        self.provider.exec(id, request).await.expect("exec")
    }

    async fn delete(&self, id: &ProviderId) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.provider.delete_server(id).await.expect("delete") == DeleteOutcome::InProgress {
            assert!(Instant::now() < deadline, "{id} still deleting");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Asserts no container, network or volume carries the namespace label.
    async fn assert_nothing_left(&self) {
        let docker = docker().await;
        let filters = std::collections::HashMap::from([("label".to_string(), vec![format!("{}={}", tags::NAMESPACE, self.namespace)])]);
        let containers = docker
            .list_containers(Some(ListContainersOptions { all: true, filters: Some(filters.clone()), ..Default::default() }))
            .await
            .expect("list containers");
        assert!(containers.is_empty(), "containers left: {containers:?}");
        let networks = docker.list_networks(Some(ListNetworksOptions { filters: Some(filters.clone()) })).await.expect("list networks");
        assert!(networks.is_empty(), "networks left: {networks:?}");
        let volumes = docker.list_volumes(Some(ListVolumesOptions { filters: Some(filters) })).await.expect("volumes");
        assert!(volumes.volumes.unwrap_or_default().is_empty(), "volumes left");
    }

    async fn networks(&self) -> Vec<bollard::models::Network> {
        let filters = std::collections::HashMap::from([("label".to_string(), vec![format!("{}={}", tags::NAMESPACE, self.namespace)])]);
        docker().await.list_networks(Some(ListNetworksOptions { filters: Some(filters) })).await.expect("networks")
    }
}

fn ip_of(obs: &ServerObservation) -> String {
    obs.addresses.iter().find(|a| a.kind == "InternalIP").map(|a| a.address.clone()).expect("an InternalIP")
}

#[tokio::test]
async fn local_passes_contract() {
    let f = fixture("contract").await;
    let opts = ContractOptions {
        run_id: format!("c{}", &uuid::Uuid::new_v4().simple().to_string()[..6]),
        namespace: f.namespace.clone(),
        image: "debian-12".into(),
        zone: String::new(),
        real_exec: true,
        deadline: Duration::from_secs(60),
    };
    run(f.provider.as_ref(), &opts).await.expect("contract");
    f.assert_nothing_left().await;
}

#[tokio::test]
async fn cluster_network_limits_and_peer_names() {
    let f = fixture("net").await;
    let a = f.running(&f.request("alpha", Some("web"), "small")).await;
    let b = f.running(&f.request("beta", Some("web"), "medium")).await;
    let solo = f.running(&f.request("solo", None, "cpu1-mem512m")).await;

    // One network for the cluster, one for the namespace's standalone servers, labelled.
    let networks = f.networks().await;
    assert_eq!(networks.len(), 2, "{networks:?}");
    let cluster_net = networks
        .iter()
        .find(|n| n.labels.as_ref().and_then(|l| l.get(tags::CLUSTER)).map(String::as_str) == Some("web"))
        .expect("the cluster network");
    assert_eq!(cluster_net.name.as_deref(), Some(format!("prov_{}_web", f.namespace).as_str()));
    assert_eq!(cluster_net.labels.as_ref().and_then(|l| l.get(tags::NAMESPACE)), Some(&f.namespace));

    // Limits from the plans.
    let docker = docker().await;
    for (obs, cpus, memory) in [(&a, 1_000_000_000, 1i64 << 30), (&b, 2_000_000_000, 2 << 30), (&solo, 1_000_000_000, 512 << 20)] {
        let inspect = docker.inspect_container(obs.provider_id.native_id(), None).await.expect("inspect");
        let host = inspect.host_config.expect("host config");
        assert_eq!(host.nano_cpus, Some(cpus), "{}", obs.plan);
        assert_eq!(host.memory, Some(memory), "{}", obs.plan);
        assert_ne!(host.privileged, Some(true));
    }
    assert_eq!(a.plan, "cpu1-mem1g");
    assert_eq!(b.plan, "cpu2-mem2g");

    // Peers resolve each other by server name on the cluster network; the standalone
    // server is on another network and does not see them.
    let seen = f.exec(&a.provider_id, &["getent", "hosts", "beta"], None, Duration::from_secs(30)).await;
    assert_eq!(seen.exit_code, Some(0), "{seen:?}");
    assert!(seen.stdout.contains(&ip_of(&b)), "alpha resolves beta to {}: {seen:?}", ip_of(&b));
    let seen = f.exec(&b.provider_id, &["getent", "hosts", "alpha"], None, Duration::from_secs(30)).await;
    assert!(seen.stdout.contains(&ip_of(&a)), "beta resolves alpha: {seen:?}");
    let hostname = f.exec(&b.provider_id, &["hostname"], None, Duration::from_secs(30)).await;
    assert_eq!(hostname.stdout.trim(), "beta");
    let isolated = f.exec(&solo.provider_id, &["getent", "hosts", "alpha"], None, Duration::from_secs(30)).await;
    assert_ne!(isolated.exit_code, Some(0), "other networks stay apart: {isolated:?}");

    // The cluster network goes with its last server; the namespace one with the standalone.
    f.delete(&a.provider_id).await;
    assert_eq!(f.networks().await.len(), 2, "beta still uses the cluster network");
    f.delete(&b.provider_id).await;
    let left = f.networks().await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].labels.as_ref().and_then(|l| l.get(tags::CLUSTER)), None);
    f.delete(&solo.provider_id).await;
    f.assert_nothing_left().await;
}

#[tokio::test]
async fn exec_streams_output_and_honours_timeout() {
    let f = fixture("exec").await;
    let server = f.running(&f.request("runner", None, "small")).await;

    // Lines arrive while the command still runs; stderr and the exit code come back.
    let (tx, mut rx) = provisioning_providers::OutputSink::channel();
    let script = "echo first; sleep 1.5; echo second; echo oops >&2; exit 3";
    let request = ExecRequest {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        stdin: None,
        env: BTreeMap::from([("GREETING".to_string(), "it's \"quoted\" $(reboot)".to_string())]),
        timeout: Duration::from_secs(30),
        output: Some(tx),
        ssh_key: None,
    };
    let provider = f.provider.clone();
    let id = server.provider_id.clone();
    let started = Instant::now();
    let task = tokio::spawn(async move { provider.exec(&id, request).await });
    let first = tokio::time::timeout(Duration::from_secs(20), rx.recv()).await.expect("a line in time");
    let first_at = started.elapsed();
    assert_eq!(first.as_deref(), Some("first"));
    let result = task.await.expect("join").expect("exec");
    let done_at = started.elapsed();
    assert!(done_at - first_at >= Duration::from_millis(1000), "streamed: first line at {first_at:?}, done at {done_at:?}");
    assert_eq!(result.exit_code, Some(3));
    assert!(!result.timed_out);
    assert_eq!(result.stdout, "first\nsecond\n");
    assert_eq!(result.stderr, "oops\n");
    let mut rest = Vec::new();
    while let Ok(line) = rx.try_recv() {
        rest.push(line);
    }
    assert!(rest.contains(&"second".to_string()) && rest.contains(&"oops".to_string()), "{rest:?}");

    // Environment values arrive as data.
    let env = ExecRequest {
        argv: vec!["printenv".into(), "GREETING".into()],
        stdin: None,
        env: BTreeMap::from([("GREETING".to_string(), "it's \"quoted\" $(reboot)".to_string())]),
        timeout: Duration::from_secs(30),
        output: None,
        ssh_key: None,
    };
    let printed = f.provider.exec(&server.provider_id, env).await.expect("printenv");
    assert_eq!(printed.stdout, "it's \"quoted\" $(reboot)\n");

    // A timeout kills the command and everything it started.
    let started = Instant::now();
    let slow = f.exec(&server.provider_id, &["sh", "-c", "sleep 301 & sleep 302; echo never"], None, Duration::from_secs(1)).await;
    assert!(slow.timed_out, "{slow:?}");
    assert_eq!(slow.exit_code, None);
    assert!(!slow.stdout.contains("never"));
    assert!(started.elapsed() < Duration::from_secs(15), "timeout took {:?}", started.elapsed());
    let ps = f.exec(&server.provider_id, &["ps", "-eo", "args"], None, Duration::from_secs(30)).await;
    assert!(!ps.stdout.contains("sleep 30"), "killed on timeout: {}", ps.stdout);
    // The machine is still usable.
    let ok = f.exec(&server.provider_id, &["true"], None, Duration::from_secs(30)).await;
    assert_eq!(ok.exit_code, Some(0));

    // A missing program is an exit code, not a provider failure.
    let missing = f.exec(&server.provider_id, &["/no/such/program"], None, Duration::from_secs(30)).await;
    assert!(matches!(missing.exit_code, Some(c) if c != 0), "{missing:?}");

    f.delete(&server.provider_id).await;
    f.assert_nothing_left().await;
}

#[tokio::test]
async fn stdin_is_byte_exact_and_mounts_are_read_only() {
    let f = fixture("stdin").await;
    let server = f.running(&f.request("data", Some("one"), "small")).await;

    let payload = "{\"config\":\"$(reboot)\",\"evil\":\"; rm -rf /\",\"q\":\"it's \\\"x\\\" `id`\"}\nline two\n\ttabbed $HOME 'single' \"double\"\nünïcødé ✓ no trailing newline";
    let echoed = f.exec(&server.provider_id, &["cat"], Some(payload.as_bytes()), Duration::from_secs(30)).await;
    assert_eq!(echoed.exit_code, Some(0), "{echoed:?}");
    assert_eq!(echoed.stdout, payload, "stdin arrives byte-exact");
    // Larger than what is kept of a command's output (128 KiB): checked by its digest.
    let digest = |text: &str| {
        use sha2::Digest;
        format!("{:x}  -\n", sha2::Sha256::digest(text.as_bytes()))
    };
    let big: String = (0..20_000).map(|i| format!("line {i} $(reboot)\n")).collect();
    let hashed = f.exec(&server.provider_id, &["sha256sum"], Some(big.as_bytes()), Duration::from_secs(60)).await;
    assert_eq!(hashed.stdout, digest(&big), "large stdin arrives byte-exact");
    let long_line = "x".repeat(300_000);
    let hashed = f.exec(&server.provider_id, &["sha256sum"], Some(long_line.as_bytes()), Duration::from_secs(60)).await;
    assert_eq!(hashed.stdout, digest(&long_line), "a 300 kB line arrives whole");
    let alive = f.exec(&server.provider_id, &["ls", "/"], None, Duration::from_secs(30)).await;
    assert!(alive.stdout.contains("etc"), "{alive:?}");

    // nu is mounted and runs; the JSON context goes in on stdin as data.
    let nu = f
        .exec(
            &server.provider_id,
            &["nu", "--stdin", "-c", "$in | from json | get evil"],
            Some(payload.lines().next().unwrap_or("").as_bytes()),
            Duration::from_secs(30),
        )
        .await;
    assert_eq!(nu.exit_code, Some(0), "{nu:?}");
    assert_eq!(nu.stdout.trim(), "; rm -rf /");
    let write = f.exec(&server.provider_id, &["sh", "-c", "echo x > /usr/local/bin/nu"], None, Duration::from_secs(30)).await;
    assert_ne!(write.exit_code, Some(0), "nu is read-only");
    let marker = f.exec(&server.provider_id, &["cat", "/opt/provisioning/catalog/marker.txt"], None, Duration::from_secs(30)).await;
    assert_eq!(marker.stdout, "catalog");
    let write = f.exec(&server.provider_id, &["touch", "/opt/provisioning/catalog/new"], None, Duration::from_secs(30)).await;
    assert_ne!(write.exit_code, Some(0), "the catalog is read-only");
    assert!(!f.catalog.path().join("new").exists());

    f.delete(&server.provider_id).await;
    f.assert_nothing_left().await;
}

#[tokio::test]
async fn missing_image_and_unreachable_engine_are_classified() {
    let f = fixture("errors").await;
    let config = ProviderConfig {
        name: "no-image".into(),
        provider_type: "local".into(),
        images: BTreeMap::from([("debian-12".to_string(), "provisioning-node:no-such-recipe".to_string())]),
        ..Default::default()
    };
    let provider = build_provider(&config).expect("build");
    let err = provider.ensure_server(&f.request("x", Some("c"), "small")).await.expect_err("no image");
    assert!(matches!(&err, ProviderError::InvalidRequest(m) if m.contains("provisioning image build")), "{err:?}");
    let err = provider.ensure_server(&f.request("x", None, "huge")).await.expect_err("bad plan");
    assert!(matches!(&err, ProviderError::InvalidRequest(m) if m.contains("huge")), "{err:?}");
    f.assert_nothing_left().await;

    let gone = ProviderId::new("local", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
    assert_eq!(f.provider.delete_server(&gone).await.expect("delete unknown"), DeleteOutcome::Gone);
    assert_eq!(f.provider.observe_server(&gone).await.expect("observe unknown"), None);
    let err = f
        .provider
        .exec(
            &gone,
            ExecRequest {
                argv: vec!["true".into()],
                stdin: None,
                env: BTreeMap::new(),
                timeout: Duration::from_secs(5),
                output: None,
                ssh_key: None,
            },
        )
        .await
        .expect_err("no machine");
    assert!(matches!(err, ProviderError::NotFound(_)), "{err:?}");

    let config = ProviderConfig {
        name: "down".into(),
        provider_type: "local".into(),
        endpoint: "unix:///nonexistent/docker.sock".into(),
        ..Default::default()
    };
    let provider = build_provider(&config).expect("building does not connect");
    let err = provider.validate_credentials().await.expect_err("no engine");
    assert!(matches!(&err, ProviderError::Transient(m) if m.contains("setup.sh")), "{err:?}");
    assert!(provider.list_servers(&[]).await.is_err());
}

#[tokio::test]
async fn image_build_is_cached() {
    let tag = node_image().await;
    let started = Instant::now();
    let again = build_node_image(&NodeImageOptions::default()).await.expect("cached build");
    assert_eq!(again, tag);
    assert!(started.elapsed() < Duration::from_secs(10), "a cached build is quick: {:?}", started.elapsed());
    let docker = docker().await;
    let latest = docker.inspect_image("provisioning-node:latest").await.expect("latest tag");
    let tagged = docker.inspect_image(&tag).await.expect("recipe tag");
    assert_eq!(latest.id, tagged.id);
}

#[tokio::test]
async fn concurrent_creates_make_one_container_per_server_and_one_network() {
    let f = fixture("race").await;
    // Two provider objects stand for two controller processes (no shared lock).
    let config = ProviderConfig { name: "second".into(), provider_type: "local".into(), ..Default::default() };
    let second = build_provider(&config).expect("build");
    let same = f.request("twin", Some("race"), "small");
    let other_a = f.request("peer-a", Some("race"), "small");
    let other_b = f.request("peer-b", Some("race"), "small");
    let (r1, r2, r3, r4) = tokio::join!(
        f.provider.ensure_server(&same),
        second.ensure_server(&same),
        f.provider.ensure_server(&other_a),
        second.ensure_server(&other_b),
    );
    let (r1, r2, r3, r4) = (r1.expect("1"), r2.expect("2"), r3.expect("3"), r4.expect("4"));
    assert_eq!(r1.provider_id, r2.provider_id, "one machine for one Server");
    let ns = vec![(tags::NAMESPACE.to_string(), f.namespace.clone())];
    let machines = f.provider.list_servers(&ns).await.expect("list");
    assert_eq!(machines.len(), 3, "{machines:?}");
    let networks = f.networks().await;
    assert_eq!(networks.len(), 1, "one network per cluster: {networks:?}");
    for obs in [&r1, &r3, &r4] {
        f.running(&f.request_for(obs)).await;
    }
    // A restarted provider (no state of its own) finds them by label.
    let fresh = build_provider(&config).expect("fresh");
    let found = fresh.find_server(&same.identity).await.expect("find").expect("found");
    assert_eq!(found.provider_id, r1.provider_id);
    // A killed machine shows as stopped, not gone.
    let killed = std::process::Command::new(std::env::var("PROVISIONING_DOCKER").unwrap_or_else(|_| "docker".into()))
        .args(["kill", r3.provider_id.native_id()])
        .output()
        .expect("docker kill");
    assert!(killed.status.success(), "{killed:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let obs = fresh.observe_server(&r3.provider_id).await.expect("observe").expect("still there");
        if obs.state == MachineState::Stopped {
            assert!(obs.addresses.is_empty(), "a stopped machine has no address: {obs:?}");
            break;
        }
        assert!(Instant::now() < deadline, "killed container observed as {obs:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let request = ExecRequest {
        argv: vec!["true".into()],
        stdin: None,
        env: BTreeMap::new(),
        timeout: Duration::from_secs(10),
        output: None,
        ssh_key: None,
    };
    let err = fresh.exec(&r3.provider_id, request).await.expect_err("exec on a stopped machine");
    assert!(err.is_retryable() && err.to_string().contains("not running"), "{err:?}");
    for obs in [&r1, &r3, &r4] {
        f.delete(&obs.provider_id).await;
    }
    f.assert_nothing_left().await;
}

/// Six provider instances (six controller processes: a leader hand-over, `provisioning test`
/// beside a running controller, …) create six members of one new Cluster at the same moment,
/// three times over. Each round must end with one network that every member runs on: on
/// Docker 20.10 two concurrent creates both succeed under one name, and a container that
/// joins a name that became ambiguous cannot start ("network … is ambiguous").
#[tokio::test]
async fn racing_processes_share_one_cluster_network() {
    const RACERS: usize = 6;
    for round in 0..3 {
        let f = fixture("netrace").await;
        let config = ProviderConfig {
            name: "racer".into(),
            provider_type: "local".into(),
            nu_binary: Some(nu_binary()),
            catalog_dir: Some(f.catalog.path().to_path_buf()),
            ..Default::default()
        };
        let racers: Vec<SharedProvider> = (0..RACERS).map(|_| build_provider(&config).expect("build")).collect();
        let requests: Vec<ServerRequest> = (0..RACERS).map(|i| f.request(&format!("m{i}"), Some("race"), "small")).collect();
        let results = futures::future::join_all(racers.iter().zip(&requests).map(|(p, r)| p.ensure_server(r))).await;
        let observed: Vec<ServerObservation> =
            results.into_iter().enumerate().map(|(i, r)| r.unwrap_or_else(|e| panic!("round {round}: racer {i} failed: {e}"))).collect();
        let networks = f.networks().await;
        assert_eq!(networks.len(), 1, "round {round}: one network per cluster: {networks:?}");
        let network_id = networks[0].id.clone().expect("network id");
        let docker = docker().await;
        for obs in &observed {
            f.running(&f.request_for(obs)).await;
            let inspected = docker.inspect_container(obs.provider_id.native_id(), None).await.expect("inspect");
            let joined: Vec<String> = inspected
                .network_settings
                .and_then(|n| n.networks)
                .unwrap_or_default()
                .into_values()
                .filter_map(|e| e.network_id)
                .collect();
            assert_eq!(joined, vec![network_id.clone()], "round {round}: every member on the one network");
        }
        for obs in &observed {
            f.delete(&obs.provider_id).await;
        }
        f.assert_nothing_left().await;
    }
}

/// The state a lost race leaves on Docker 20.10 (both racers created the cluster's network,
/// and one racer's member already runs on the newer one, so it cannot simply be removed),
/// built by hand: the next create must still start, every member must end up on the oldest
/// network, peers resolve each other by name, and the duplicate is gone.
#[tokio::test]
async fn a_member_running_on_a_duplicate_network_is_moved_to_the_oldest() {
    let f = fixture("netdup").await;
    let image = node_image().await;
    let network = provisioning_providers::local::spec::NetworkSpec::new(&f.namespace, Some("dup"));
    let docker_cli = std::env::var("PROVISIONING_DOCKER").unwrap_or_else(|_| "docker".into());
    let cli = |args: &[&str]| -> String {
        let out = std::process::Command::new(&docker_cli).args(args).output().expect("docker");
        assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let docker = docker().await;
    // Through the API as the provider calls it (the CLI asks the engine to check for duplicates).
    let create_network = || async {
        let request = bollard::models::NetworkCreateRequest {
            name: network.name.clone(),
            driver: Some("bridge".into()),
            labels: Some(network.labels.clone().into_iter().collect()),
            ..Default::default()
        };
        docker.create_network(request).await.expect("create network").id
    };
    let oldest = create_network().await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let newer = create_network().await;
    assert_ne!(oldest, newer, "Docker 20.10 makes two networks of one name");
    // The other racer's member, running on the newer network.
    let racer = f.request("racer", Some("dup"), "small");
    let body = bollard::models::ContainerCreateBody {
        image: Some(image.clone()),
        cmd: Some(vec!["sleep".into(), "infinity".into()]),
        labels: Some(racer.identity.tags().into_iter().collect()),
        host_config: Some(bollard::models::HostConfig { network_mode: Some(newer.clone()), ..Default::default() }),
        networking_config: Some(bollard::models::NetworkingConfig {
            endpoints_config: Some(std::collections::HashMap::from([(
                newer.clone(),
                bollard::models::EndpointSettings {
                    aliases: Some(vec!["racer".into()]),
                    network_id: Some(newer.clone()),
                    ..Default::default()
                },
            )])),
        }),
        ..Default::default()
    };
    let racer_id = docker.create_container(None::<bollard::query_parameters::CreateContainerOptions>, body).await.expect("create racer").id;
    docker.start_container(&racer_id, None).await.expect("start racer");

    let ours = f.running(&f.request("ours", Some("dup"), "small")).await;
    let networks = f.networks().await;
    let ids: Vec<String> = networks.iter().filter_map(|n| n.id.clone()).collect();
    assert_eq!(ids, vec![oldest.clone()], "the duplicate is merged into the oldest network");
    for container in [racer_id.as_str(), ours.provider_id.native_id()] {
        let joined = cli(&["inspect", "-f", "{{range .NetworkSettings.Networks}}{{.NetworkID}} {{end}}", container]);
        assert_eq!(joined, oldest, "{container} is on the oldest network");
    }
    let resolved = f.exec(&ours.provider_id, &["getent", "hosts", "racer"], None, Duration::from_secs(10)).await;
    assert_eq!(resolved.exit_code, Some(0), "the moved member resolves by its server name: {resolved:?}");
    let racer_obs = f.provider.find_server(&racer.identity).await.expect("find").expect("found");
    for id in [&ours.provider_id, &racer_obs.provider_id] {
        f.delete(id).await;
    }
    f.assert_nothing_left().await;
}
