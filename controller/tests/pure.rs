//! Pure pipeline steps (validate, plan, status, conditions) from YAML fixtures: no API.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use provisioning_controller::conditions::{self, Summary};
use provisioning_controller::effective_workspace;
use provisioning_controller::server::plan::{CleanupStep, Step, cleanup_step, next_step};
use provisioning_controller::server::status::{Machine, StatusInput, desired};
use provisioning_controller::server::validate;
use provisioning_controller::workspace::status::{self as ws_status, AccountCheck};
use provisioning_crds::{Server, Workspace};
use provisioning_providers::{Address, MachineState, Provider, ProviderId, ServerObservation};

fn workspace(name: &str) -> Arc<Workspace> {
    let text = std::fs::read_to_string(format!("{}/tests/fixtures/{name}.yaml", env!("CARGO_MANIFEST_DIR"))).expect("fixture");
    Arc::new(serde_yaml_ng::from_str(&text).expect("workspace fixture parses"))
}

fn servers() -> Vec<Server> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/servers.yaml")).expect("fixture");
    serde_yaml_ng::Deserializer::from_str(&text).map(|doc| serde::Deserialize::deserialize(doc).expect("server fixture parses")).collect()
}

fn server(name: &str) -> Server {
    servers().into_iter().find(|s| s.metadata.name.as_deref() == Some(name)).expect("fixture server")
}

fn effective() -> effective_workspace::EffectiveWorkspace {
    effective_workspace::resolve("dev", [&workspace("workspace-dev")], &provisioning_controller::config::default_workspace())
}

fn sim_plans() -> impl Fn(&str) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("pure-test-{}", std::process::id()));
    let provider = provisioning_controller::testing::simulated(&dir, "sim").expect("simulated provider");
    move |plan: &str| provider.resolve_plan(plan).map_err(|e| e.to_string())
}

fn ts(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

#[test]
fn validate_fills_workspace_defaults() {
    let ws = effective();
    let s = server("plain");
    let account = validate::account(&s.spec, &ws, None).expect("default account");
    assert_eq!(account.name, "sim");
    let valid = validate::validate(&s.spec, &ws, account, sim_plans()).expect("valid");
    assert_eq!(valid.plan, "medium");
    assert_eq!(valid.resolved_plan, "sim-2cpu-4gb");
    assert_eq!(valid.image, "debian-12");
    assert_eq!(valid.zone, "zone-a");
}

#[test]
fn validate_passes_native_plans_and_spec_values() {
    let ws = effective();
    let s = server("native-plan");
    let account = validate::account(&s.spec, &ws, None).expect("account");
    let valid = validate::validate(&s.spec, &ws, account, sim_plans()).expect("valid");
    assert_eq!((valid.resolved_plan.as_str(), valid.zone.as_str(), valid.image.as_str()), ("sim-8cpu-16gb", "zone-b", "ubuntu-24.04"));
}

#[test]
fn validate_rejects_unknown_provider_and_plan_with_exact_messages() {
    let ws = effective();
    let err = validate::account(&server("unknown-provider").spec, &ws, None).expect_err("unknown provider");
    assert_eq!(err.reason, "UnknownProvider");
    assert_eq!(err.message, "provider \"upcloud-x\" is not defined in workspace \"dev\" (accounts: sim, aws-main)");
    let s = server("bad-plan");
    let account = validate::account(&s.spec, &ws, None).expect("account");
    let err = validate::validate(&s.spec, &ws, account, sim_plans()).expect_err("bad plan");
    assert_eq!(err.reason, "UnknownPlan");
    assert!(err.message.contains("plan \"gigantic\" is not offered by the simulated provider"), "{}", err.message);
}

#[test]
fn a_machine_never_moves_to_another_account() {
    let ws = effective();
    let s = server("plain");
    // The machine was made with the account the Server resolves to: fine.
    assert_eq!(validate::account(&s.spec, &ws, Some("sim")).expect("same account").name, "sim");
    // It was made elsewhere (e.g. the controller's default workspace, or spec.provider was
    // edited afterwards): stall, do not create a second machine at the new account.
    let err = validate::account(&s.spec, &ws, Some("local")).expect_err("moved");
    assert_eq!(err.reason, "ProviderChanged");
    assert!(err.message.contains("\"local\"") && err.message.contains("\"sim\""), "{}", err.message);
}

#[test]
fn max_servers_counts_older_servers() {
    let ws = effective();
    assert!(validate::within_limit(None, &ws).is_ok());
    assert!(validate::within_limit(Some(1), &ws).is_ok());
    let err = validate::within_limit(Some(2), &ws).expect_err("third server over a limit of 2");
    assert_eq!(err.reason, "ServerLimitReached");
    assert!(err.message.contains("allows at most 2 servers"), "{}", err.message);
}

#[test]
fn plan_chooses_the_next_provider_step() {
    assert_eq!(next_step(&server("plain")), Step::Create);
    assert_eq!(next_step(&server("pending")), Step::FindThenCreate);
    assert_eq!(next_step(&server("created")), Step::Observe(ProviderId("simulated://sim-0001".into())));
    assert_eq!(next_step(&server("adopted")), Step::Adopt(ProviderId("simulated://sim-legacy-1".into())));
}

#[test]
fn cleanup_plan_honours_deletion_policy_and_the_guard() {
    assert_eq!(cleanup_step(&server("plain")), CleanupStep::Nothing);
    assert_eq!(cleanup_step(&server("orphaned")), CleanupStep::Nothing);
    assert_eq!(cleanup_step(&server("pending")), CleanupStep::FindThenDelete);
    assert_eq!(cleanup_step(&server("created")), CleanupStep::Delete(ProviderId("simulated://sim-0001".into())));
    // Adopted machines are orphaned unless Delete is written, and deleted only once the
    // adoption was recorded (it passed the ownership check).
    assert_eq!(cleanup_step(&server("adopted")), CleanupStep::Nothing);
    assert_eq!(cleanup_step(&server("adopted-delete")), CleanupStep::Delete(ProviderId("simulated://sim-legacy-2".into())));
    assert_eq!(cleanup_step(&server("adopted-delete-unverified")), CleanupStep::Nothing);
}

fn running(id: &str) -> ServerObservation {
    ServerObservation {
        provider_id: ProviderId(id.into()),
        state: MachineState::Running,
        addresses: vec![Address { kind: "InternalIP".into(), address: "192.0.2.7".into() }],
        plan: "sim-1cpu-1gb".into(),
        tags: Default::default(),
    }
}

#[test]
fn status_from_an_observation_is_ready_and_stable() {
    let s = server("plain");
    let input = |previous, now| StatusInput {
        previous,
        generation: Some(1),
        provider: Some("sim".into()),
        resolved_plan: Some("sim-1cpu-1gb".into()),
        machine: Machine::Observed(running("simulated://sim-9")),
        summary: None,
        paused: false,
        now,
    };
    let first = desired(input(s.status.as_ref(), ts("2024-01-01T00:00:00Z")));
    assert_eq!(first.phase.as_deref(), Some("Running"));
    assert_eq!(first.provider_id.as_deref(), Some("simulated://sim-9"));
    assert_eq!(first.addresses[0].address, "192.0.2.7");
    assert!(conditions::is_true(&first.conditions, "Ready"));
    assert!(conditions::is_true(&first.conditions, "Provisioned"));
    assert_eq!(conditions::status_of(&first.conditions, "Reconciling"), Some("False"));
    assert_eq!(conditions::status_of(&first.conditions, "Stalled"), Some("False"));
    assert!(first.conditions.iter().all(|c| c.observed_generation == Some(1)));
    // The same observation later: identical status, so no write.
    let again = desired(input(Some(&first), ts("2024-06-01T00:00:00Z")));
    assert_eq!(first, again);
    // Reusing the recorded observation gives the same status too.
    let unchanged = desired(StatusInput { machine: Machine::Unchanged, ..input(Some(&first), ts("2024-06-02T00:00:00Z")) });
    assert_eq!(first, unchanged);
}

#[test]
fn first_visit_is_unknown_and_stall_keeps_machine_fields() {
    let s = server("plain");
    let initial = desired(StatusInput {
        previous: None,
        generation: Some(1),
        provider: None,
        resolved_plan: None,
        machine: Machine::None,
        summary: Some(Summary::Unknown { reason: "Initializing".into(), message: String::new() }),
        paused: false,
        now: ts("2024-01-01T00:00:00Z"),
    });
    assert_eq!(conditions::status_of(&initial.conditions, "Ready"), Some("Unknown"));
    assert_eq!(conditions::status_of(&initial.conditions, "Provisioned"), Some("Unknown"));
    assert_eq!(initial.phase.as_deref(), Some("Pending"));
    let created = server("created");
    let stalled = desired(StatusInput {
        previous: created.status.as_ref(),
        generation: Some(2),
        provider: None,
        resolved_plan: None,
        machine: Machine::Unchanged,
        summary: Some(Summary::stalled("UnknownPlan", "plan \"x\" is not offered")),
        paused: false,
        now: ts("2024-01-02T00:00:00Z"),
    });
    assert_eq!(stalled.provider_id.as_deref(), Some("simulated://sim-0001"));
    let stalled_condition = conditions::find(&stalled.conditions, "Stalled").expect("Stalled");
    assert_eq!((stalled_condition.status.as_str(), stalled_condition.message.as_str()), ("True", "plan \"x\" is not offered"));
    let ready = conditions::find(&stalled.conditions, "Ready").expect("Ready");
    assert_eq!(ready.status, "False");
    assert_eq!(ready.last_transition_time.0, ts("2024-01-02T00:00:00Z"), "Ready flipped, so its time moved");
    drop(s);
}

#[test]
fn paused_keeps_ready_and_adds_paused() {
    let created = server("created");
    let paused = desired(StatusInput {
        previous: created.status.as_ref(),
        generation: Some(2),
        provider: None,
        resolved_plan: None,
        machine: Machine::Unchanged,
        summary: None,
        paused: true,
        now: ts("2024-03-01T00:00:00Z"),
    });
    let ready = conditions::find(&paused.conditions, "Ready").expect("Ready");
    assert_eq!(ready.status, "True");
    assert_eq!(ready.last_transition_time.0, ts("2024-01-01T00:00:00Z"));
    assert!(conditions::is_true(&paused.conditions, "Paused"));
    assert_eq!(conditions::status_of(&paused.conditions, "Reconciling"), Some("False"));
}

#[test]
fn workspace_namespace_conflict_stalls_the_newer_one() {
    let older = workspace("workspace-dev");
    let newer = workspace("workspace-dev-newer");
    let all = [older.clone(), newer.clone()];
    assert_eq!(provisioning_controller::workspace::validate::check_namespace(&older, all.iter()), Ok("dev".to_string()));
    let conflict = provisioning_controller::workspace::validate::check_namespace(&newer, all.iter()).expect_err("conflict");
    assert_eq!(conflict.message(), "namespace \"dev\" is already claimed by the older workspace \"dev\"");
}

#[test]
fn workspace_status_summarises_accounts() {
    let now = ts("2024-01-01T00:00:00Z");
    let base = |accounts: Vec<(String, AccountCheck)>, conflict: Option<String>| {
        ws_status::desired(ws_status::StatusInput {
            previous: None,
            generation: Some(1),
            namespace: Some("dev".into()),
            conflict,
            accounts,
            counts: None,
            worst: None,
            namespace_terminating: false,
            paused: false,
            now,
        })
    };
    let ok = base(vec![("sim".into(), AccountCheck::Ready)], None);
    assert!(conditions::is_true(&ok.conditions, "Ready"));
    assert!(conditions::is_true(&ok.conditions, "ProvidersReady"));
    assert_eq!(ok.providers[0].message, "credentials accepted");
    let failed = base(
        vec![("sim".into(), AccountCheck::Ready), ("aws-main".into(), AccountCheck::Failed("Secret dev/aws-creds does not exist".into()))],
        None,
    );
    assert!(conditions::is_true(&failed.conditions, "Stalled"));
    assert_eq!(
        conditions::find(&failed.conditions, "Ready").map(|c| c.message.as_str()),
        Some("provider account \"aws-main\": Secret dev/aws-creds does not exist")
    );
    assert!(!failed.providers[1].ready);
    let retrying = base(vec![("sim".into(), AccountCheck::Retrying("timeout".into()))], None);
    assert!(conditions::is_true(&retrying.conditions, "Reconciling"));
    let conflict = base(vec![], Some("namespace taken".into()));
    assert_eq!(conditions::find(&conflict.conditions, "Stalled").map(|c| c.reason.as_str()), Some("NamespaceConflict"));
}

#[test]
fn an_adopted_machine_keeps_its_observed_plan_when_not_reobserved() {
    let s = server("adopted");
    let observed = ServerObservation { plan: "sim-2cpu-4gb".into(), ..running("simulated://sim-legacy-1") };
    let first = desired(StatusInput {
        previous: s.status.as_ref(),
        generation: Some(1),
        provider: Some("sim".into()),
        resolved_plan: Some("sim-1cpu-1gb".into()),
        machine: Machine::Observed(observed),
        summary: None,
        paused: false,
        now: ts("2024-01-01T00:00:00Z"),
    });
    assert_eq!(first.resolved_plan.as_deref(), Some("sim-2cpu-4gb"));
    let cached = desired(StatusInput {
        previous: Some(&first),
        generation: Some(1),
        provider: Some("sim".into()),
        resolved_plan: Some("sim-1cpu-1gb".into()),
        machine: Machine::Unchanged,
        summary: None,
        paused: false,
        now: ts("2024-01-02T00:00:00Z"),
    });
    assert_eq!(first, cached, "no flip-flop between the spec's plan and the observed one");
}
