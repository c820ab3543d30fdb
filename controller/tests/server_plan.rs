//! The Server planner (pure): what a spec change does to the machine — Create, Update in
//! place, Replace with the reason, refused by updatePolicy — and the approval gate, from YAML
//! fixtures and the real providers' capability and price tables (no API, no Docker).

use provisioning_controller::server::plan::{Carry, Gate, approval, gate, spec_plan, summary};
use provisioning_controller::server::validate::ValidServer;
use provisioning_crds::{ANNOTATION_APPROVE, Approval, ChangeAction, PlannedChange, ProviderAccount, Server};
use provisioning_providers::{MachineField, Provider};

fn servers() -> Vec<Server> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/plan_fixtures/servers.yaml")).expect("fixture");
    serde_yaml_ng::Deserializer::from_str(&text).map(|doc| serde::Deserialize::deserialize(doc).expect("server fixture parses")).collect()
}

fn server(name: &str) -> Server {
    servers().into_iter().find(|s| s.metadata.name.as_deref() == Some(name)).expect("fixture server")
}

fn local() -> provisioning_providers::local::LocalProvider {
    let dir = std::env::temp_dir().join(format!("server-plan-test-{}", std::process::id()));
    provisioning_controller::testing::local(&dir).expect("local provider (nothing is contacted)")
}

/// The spec with defaults filled in, as validate makes it (workspace defaults: debian-12, "").
fn valid(server: &Server, provider: &dyn Provider) -> ValidServer {
    let plan = if server.spec.plan.is_empty() { "small".to_string() } else { server.spec.plan.clone() };
    ValidServer {
        account: serde_json::from_value::<ProviderAccount>(serde_json::json!({"name": "local", "type": "local"})).expect("account"),
        resolved_plan: provider.resolve_plan(&plan).expect("plan resolves"),
        plan,
        zone: server.spec.zone.clone(),
        spec_zone: server.spec.zone.clone(),
        image: if server.spec.image.is_empty() { "debian-12".into() } else { server.spec.image.clone() },
        fallback_zones: server.spec.fallback_zones.clone(),
        public_ip: server.spec.public_ip,
        disks: server.spec.disks.clone(),
    }
}

fn plan_with(server: &Server, provider: &dyn Provider) -> provisioning_controller::server::plan::ServerPlan {
    let v = valid(server, provider);
    spec_plan(server, &v, server.status.as_ref(), |f| provider.in_place(f), |a, b| provider.same_plan(a, b), |p, z| provider.price(p, z))
}

#[test]
fn a_server_without_a_machine_plans_one_create() {
    let p = plan_with(&server("fresh"), &local());
    assert_eq!(p.carry, Carry::Create);
    assert_eq!(p.plan.summary, "1 to create");
    assert_eq!(p.plan.changes.len(), 1);
    let c = &p.plan.changes[0];
    assert_eq!((c.resource.as_str(), c.action, c.field.as_str()), ("Server/team/fresh", ChangeAction::Create, ""));
    assert!(c.to.contains("cpu1-mem1g") && c.to.contains("debian-12"), "{c:?}");
    // Local machines are free: the delta is known and zero.
    assert_eq!((p.plan.monthly_cost_delta.as_str(), p.plan.currency.as_str()), ("0.00", "USD"));
    assert_eq!(p.plan.id.len(), 10, "short id: {}", p.plan.id);
}

#[test]
fn local_plan_change_is_an_update_in_place() {
    let p = plan_with(&server("resized"), &local());
    assert_eq!(p.carry, Carry::Update);
    assert_eq!(p.plan.summary, "1 to update");
    assert_eq!(
        p.plan.changes,
        vec![PlannedChange {
            resource: "Server/team/resized".into(),
            field: "spec.plan".into(),
            action: ChangeAction::Update,
            from: "cpu1-mem1g".into(),
            to: "cpu2-mem2g".into(),
            reason: String::new(),
        }]
    );
}

#[test]
fn local_image_change_forces_a_replace_with_the_reason() {
    let p = plan_with(&server("reimaged"), &local());
    assert_eq!(p.carry, Carry::Replace);
    // Two fields of one Server: counted once, under the strongest action.
    assert_eq!(p.plan.summary, "1 to replace");
    let fields: Vec<(&str, ChangeAction)> = p.plan.changes.iter().map(|c| (c.field.as_str(), c.action)).collect();
    assert_eq!(fields, [("spec.plan", ChangeAction::Update), ("spec.image", ChangeAction::Replace)]);
    assert_eq!(p.plan.changes[1].reason, "the local provider cannot change the image of a running container");
    assert_eq!((p.plan.changes[1].from.as_str(), p.plan.changes[1].to.as_str()), ("debian-12", "provisioning-node:next"));
}

#[test]
fn cloud_plan_change_is_a_replace_and_priced() {
    // The simulated provider models a cloud that resizes only stopped machines.
    let dir = std::env::temp_dir().join(format!("server-plan-sim-{}", std::process::id()));
    let sim = provisioning_controller::testing::simulated(&dir, "sim").expect("simulated provider");
    let mut s = server("resized");
    s.spec.provider = "sim".into();
    if let Some(st) = s.status.as_mut() {
        st.provider_id = Some("simulated://i-1".into());
        st.resolved_plan = Some(sim.resolve_plan("small").expect("plan"));
    }
    let p = plan_with(&s, &sim);
    assert_eq!(p.carry, Carry::Replace);
    assert!(p.plan.changes[0].reason.contains("only while it is stopped"), "{:?}", p.plan.changes);
    // AWS prices: t3.small → t3.medium in eu-west-1 is +$16.64/month (0.0456-0.0228 × 730).
    let aws = |plan: &str, _zone: &str| provisioning_providers::prices::aws("eu-west-1", plan);
    let mut v = valid(&s, &sim);
    v.resolved_plan = "t3.medium".into();
    let mut st = s.status.clone().expect("status");
    st.resolved_plan = Some("t3.small".into());
    let priced = spec_plan(&s, &v, Some(&st), |f| sim.in_place(f), |a, b| a == b, aws);
    assert_eq!((priced.plan.monthly_cost_delta.as_str(), priced.plan.currency.as_str()), ("+16.64", "USD"));
    let cheaper = spec_plan(
        &s,
        &ValidServer { resolved_plan: "t3.small".into(), ..v.clone() },
        Some(&provisioning_crds::ServerStatus { resolved_plan: Some("t3.medium".into()), ..st.clone() }),
        |f| sim.in_place(f),
        |a, b| a == b,
        aws,
    );
    assert_eq!(cheaper.plan.monthly_cost_delta, "-16.64");
    // Unknown price (a native plan outside the table): no delta, never a guess.
    let unknown =
        spec_plan(&s, &ValidServer { resolved_plan: "m7i.large".into(), ..v }, Some(&st), |f| sim.in_place(f), |a, b| a == b, aws);
    assert_eq!(unknown.plan.monthly_cost_delta, "");
}

#[test]
fn update_policy_never_and_in_place_refuse_naming_the_field() {
    let never = plan_with(&server("frozen"), &local());
    let Carry::Refused(message) = &never.carry else { panic!("Never refuses: {:?}", never.carry) };
    assert!(message.contains("spec.plan") && message.contains("Never") && message.contains("local://0f0f0f"), "{message}");
    // The plan still says what the change would be.
    assert_eq!(never.plan.summary, "1 to update");
    let in_place = plan_with(&server("inplace-only"), &local());
    let Carry::Refused(message) = &in_place.carry else { panic!("InPlace refuses a replace: {:?}", in_place.carry) };
    assert!(message.contains("spec.image") && message.contains("cannot change the image"), "{message}");
    // InPlace allows what can be done in place.
    let mut resize_only = server("inplace-only");
    resize_only.spec.image = String::new();
    resize_only.spec.plan = "medium".into();
    assert_eq!(plan_with(&resize_only, &local()).carry, Carry::Update);
}

#[test]
fn equal_sizes_and_adopted_machines_plan_nothing() {
    let same = plan_with(&server("unchanged"), &local());
    assert_eq!((same.carry.clone(), same.plan.summary.as_str()), (Carry::Nothing, "no changes"));
    assert!(same.plan.changes.is_empty());
    let adopted = plan_with(&server("adopted"), &local());
    assert_eq!(adopted.carry, Carry::Nothing, "an adopted machine is never changed");
    // The disagreement is still told: spec.plan xlarge vs the machine's cpu1-mem1g, as a NoOp.
    assert_eq!(adopted.plan.summary, "no changes");
    assert!(!adopted.plan.has_changes());
    let c = adopted.plan.changes.iter().find(|c| c.field == "spec.plan").expect("the plan difference is listed");
    assert_eq!(c.action, provisioning_crds::ChangeAction::NoOp);
    assert_eq!(c.from, "cpu1-mem1g");
    assert!(c.reason.contains("adopted"), "{}", c.reason);
}

#[test]
fn the_plan_id_is_stable_and_follows_desired_and_observed_state() {
    let a = plan_with(&server("resized"), &local());
    assert_eq!(a.plan.id, plan_with(&server("resized"), &local()).plan.id, "same inputs, same id");
    let mut larger = server("resized");
    larger.spec.plan = "large".into();
    assert_ne!(a.plan.id, plan_with(&larger, &local()).plan.id, "another desired plan, another id");
    let mut other_machine = server("resized");
    if let Some(st) = other_machine.status.as_mut() {
        st.provider_id = Some("local://ffffff".into());
    }
    assert_ne!(a.plan.id, plan_with(&other_machine, &local()).plan.id, "another observed machine, another id");
    // The same change asked again by a later spec (resized, changed back, resized again):
    // another id, so the approval of the first time does not carry out the second.
    let mut again = server("resized");
    again.metadata.generation = Some(again.metadata.generation.unwrap_or(1) + 2);
    let b = plan_with(&again, &local());
    assert_eq!(a.plan.changes, b.plan.changes);
    assert_ne!(a.plan.id, b.plan.id, "another generation, another id");
}

#[test]
fn manual_approval_waits_for_the_current_plan_id() {
    let s = server("approved");
    let p = plan_with(&s, &local()).plan;
    assert_eq!(approval(&s, None), Approval::Manual);
    assert_eq!(approval(&server("resized"), Some(Approval::Manual)), Approval::Manual, "the workspace default applies");
    assert_eq!(approval(&server("resized"), None), Approval::Automatic);
    // The placeholder approval names another plan: stale, and ignored.
    assert_eq!(gate(&s, Approval::Manual, &p), Gate::Stale("PLACEHOLDER".into()));
    let mut approved = s.clone();
    approved.metadata.annotations.get_or_insert_default().insert(ANNOTATION_APPROVE.into(), p.id.clone());
    assert_eq!(gate(&approved, Approval::Manual, &p), Gate::Go { approved: Some(p.clone()) });
    // The approval of the plan carried out last is not stale: the next plan just waits.
    approved.metadata.annotations.get_or_insert_default().insert(ANNOTATION_APPROVE.into(), "00aa11bb22".into());
    assert_eq!(gate(&approved, Approval::Manual, &p), Gate::Wait);
    approved.metadata.annotations = None;
    assert_eq!(gate(&approved, Approval::Manual, &p), Gate::Wait);
    assert_eq!(gate(&approved, Approval::Automatic, &p), Gate::Go { approved: None });
}

#[test]
fn summaries_count_resources_under_their_strongest_action() {
    let change = |r: &str, a| PlannedChange {
        resource: r.into(),
        field: "f".into(),
        action: a,
        from: String::new(),
        to: String::new(),
        reason: String::new(),
    };
    assert_eq!(summary(&[]), "no changes");
    assert_eq!(
        summary(&[
            change("Server/a/1", ChangeAction::Create),
            change("Server/a/2", ChangeAction::Update),
            change("Server/a/3", ChangeAction::Update),
            change("Server/a/3", ChangeAction::Replace),
            change("Server/a/4", ChangeAction::NoOp),
            change("Server/a/5", ChangeAction::Update),
        ]),
        "1 to create, 2 to update, 1 to replace"
    );
    assert_eq!(
        [MachineField::Plan, MachineField::Zone, MachineField::Image].map(MachineField::spec_path),
        ["spec.plan", "spec.zone", "spec.image"]
    );
}

fn disk(name: &str, size: &str, mount_path: &str) -> provisioning_crds::Disk {
    provisioning_crds::Disk { name: name.into(), size: size.into(), mount_path: mount_path.into(), ..Default::default() }
}

#[test]
fn disks_are_listed_in_the_create_and_a_change_to_an_existing_machine_is_refused_naming_the_field() {
    let mut fresh = server("fresh");
    fresh.spec.disks = vec![
        disk("data", "100Gi", "/var/lib/data"),
        provisioning_crds::Disk { deletion_policy: provisioning_crds::DiskDeletionPolicy::Retain, ..disk("keep", "20Gi", "/srv") },
    ];
    let p = plan_with(&fresh, &local());
    assert_eq!(p.carry, Carry::Create);
    let to = &p.plan.changes[0].to;
    assert!(to.contains("disks data 100Gi at /var/lib/data, keep 20Gi at /srv (Retain)"), "{to}");

    // The machine exists and was made with these disks: nothing to do.
    let provider = local();
    let mut made = fresh.clone();
    let v = valid(&made, &provider);
    made.status = Some(provisioning_crds::ServerStatus {
        provider_id: Some("local://0d0d0d".into()),
        resolved_plan: Some(v.resolved_plan.clone()),
        zone: Some(String::new()),
        image: Some(v.image.clone()),
        disks: Some(fresh.spec.disks.clone()),
        ..Default::default()
    });
    let same = plan_with(&made, &provider);
    assert_eq!((same.carry.clone(), same.plan.summary.as_str()), (Carry::Nothing, "no changes"));

    // A shrink is refused, naming the field and both sizes.
    let mut shrunk = made.clone();
    shrunk.spec.disks[0].size = "50Gi".into();
    let p = plan_with(&shrunk, &provider);
    let Carry::Refused(message) = &p.carry else { panic!("a shrink is refused: {:?}", p.carry) };
    assert!(message.contains("spec.disks[data].size") && message.contains("100Gi") && message.contains("50Gi"), "{message}");
    assert!(message.contains("cannot shrink"), "{message}");

    // A disk added to (or grown on) an existing machine is shown and refused: not carried out yet.
    let mut added = made.clone();
    added.spec.disks.push(disk("logs", "10Gi", "/var/log/app"));
    added.spec.disks[0].size = "200Gi".into();
    let p = plan_with(&added, &provider);
    let Carry::Refused(message) = &p.carry else { panic!("refused: {:?}", p.carry) };
    assert!(
        message.contains("spec.disks[data]") && message.contains("spec.disks[logs]") && message.contains("not supported yet"),
        "{message}"
    );
    let fields: Vec<(&str, ChangeAction)> = p.plan.changes.iter().map(|c| (c.field.as_str(), c.action)).collect();
    assert_eq!(fields, vec![("spec.disks[data]", ChangeAction::Update), ("spec.disks[logs]", ChangeAction::Create)]);
}

#[test]
fn disks_add_their_price_to_the_plan_and_cost() {
    // aws us-east-1: t3.small $0.0208/h ($15.18/mo) + 100 GiB gp3 at $0.08 = $8.00/mo.
    let config = provisioning_providers::ProviderConfig {
        name: "aws".into(),
        provider_type: "aws".into(),
        region: "us-east-1".into(),
        credentials: provisioning_providers::Credentials(
            [("AWS_ACCESS_KEY_ID".to_string(), "AKIAPLANTEST00000001".to_string()), ("AWS_SECRET_ACCESS_KEY".to_string(), "x".to_string())]
                .into(),
        ),
        ..Default::default()
    };
    let aws = provisioning_providers::build_provider(&config).expect("aws provider (no call made)");
    let disks = [disk("data", "100Gi", "")];
    let with = provisioning_controller::cost::machine_price(aws.as_ref(), "t3.small", "", &disks).expect("priced");
    let without = aws.price("t3.small", "").expect("priced");
    assert_eq!(with.monthly_micros - without.monthly_micros, 8_000_000);
    let cost = provisioning_controller::cost::server_cost(&Ok(with));
    assert_eq!(cost.summary, "$23.18/mo");
    assert!(cost.source.contains("1 disk(s) included"), "{}", cost.source);
}
