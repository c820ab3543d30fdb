//! Extra disks (`spec.disks`) at each provider: a machine with two disks — `data` (Delete)
//! and `keep` (Retain) — gets two volumes of the asked size and type, tagged with the Server
//! and the disk; deleting the machine removes `data` and leaves `keep`, marked retained.
//! aws against moto (BlockDeviceMapping, TagSpecification volume, CreateTags, DescribeVolumes),
//! upcloud against the double (storage devices `create`, detach before `DELETE
//! ?storages=1`), simulated (its store keeps the retained volume).

mod support;

use std::time::Duration;

use provisioning_providers::aws::AwsProvider;
use provisioning_providers::{
    Credentials, DeleteOutcome, DiskRequest, NetworkSettings, Provider, ProviderConfig, ServerIdentity, ServerRequest, build_provider, tags,
};
use support::moto::Moto;
use upcloud_double::{DoubleConfig, UpcloudDouble};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn request(uid: &str, data_type: &str, keep_type: &str, sizes: (u64, u64)) -> ServerRequest {
    ServerRequest {
        identity: ServerIdentity { uid: uid.into(), namespace: "disks".into(), name: uid.into(), cluster: None },
        plan: "small".into(),
        zone: String::new(),
        image: "debian-12".into(),
        ssh_public_key: None,
        extra_tags: Default::default(),
        instance_profile: String::new(),
        public_ip: None,
        disks: vec![
            DiskRequest { name: "data".into(), size_gib: sizes.0, disk_type: data_type.into(), mount_path: String::new(), retain: false },
            DiskRequest { name: "keep".into(), size_gib: sizes.1, disk_type: keep_type.into(), mount_path: String::new(), retain: true },
        ],
        host_key: None,
    }
}

async fn delete_until_gone(provider: &dyn Provider, id: &provisioning_providers::ProviderId) -> TestResult {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while provider.delete_server(id).await? != DeleteOutcome::Gone {
        if std::time::Instant::now() > deadline {
            return Err(format!("delete of {id} did not finish").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aws_disks_are_tagged_ebs_volumes_and_retain_outlives_the_instance() -> TestResult {
    let moto = Moto::start();
    let config = ProviderConfig {
        name: "disks".into(),
        provider_type: "aws".into(),
        region: "us-east-1".into(),
        endpoint: moto.endpoint.clone(),
        credentials: Credentials(
            [
                ("AWS_ACCESS_KEY_ID".to_string(), "AKIADISKSTEST0000001".to_string()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), "disks-test-secret".to_string()),
            ]
            .into(),
        ),
        images: [("debian-12".to_string(), "ami-1e749f67".to_string())].into(),
        rate_limit: 200,
        network: NetworkSettings { ssh_source_cidrs: vec!["203.0.113.7/32".into()], ..Default::default() },
        ..Default::default()
    };
    let provider = AwsProvider::new(&config)?;
    let uid = "0d15c5e7-0000-4000-8000-000000000001";
    let created = provider.ensure_server(&request(uid, "", "st1", (100, 125))).await?;
    // A repeated ensure (a lost answer) finds the instance and names its disks again
    // (idempotent): no second instance, no second set of volumes.
    let again = provider.ensure_server(&request(uid, "", "st1", (100, 125))).await?;
    assert_eq!(again.provider_id, created.provider_id);
    let by_uid = [(tags::SERVER_UID.to_string(), uid.to_string())];
    let volumes = provider.volumes_tagged(&by_uid).await?;
    let tag = |v: &provisioning_providers::aws::model::Volume, key: &str| {
        v.tags.items.iter().find(|t| t.key == key).and_then(|t| t.value.clone()).unwrap_or_default()
    };
    let mut disks: Vec<(String, u64, String, String)> = volumes
        .iter()
        .filter(|v| !tag(v, tags::DISK).is_empty())
        .map(|v| (tag(v, tags::DISK), v.size, v.volume_type.clone(), tag(v, tags::RETAINED)))
        .collect();
    disks.sort();
    assert_eq!(
        disks,
        vec![("data".into(), 100, "gp3".into(), String::new()), ("keep".into(), 125, "st1".into(), "true".into())],
        "two volumes of the asked size and type (gp3 by default), named by disk, Retain marked"
    );
    let devices: Vec<String> = provider
        .instance_volumes(created.provider_id.native_id())
        .await?
        .iter()
        .flat_map(|v| v.attachments.items.iter().map(|a| a.device.clone()))
        .collect();
    assert!(devices.contains(&"/dev/sdf".to_string()) && devices.contains(&"/dev/sdg".to_string()), "{devices:?}");

    delete_until_gone(&provider, &created.provider_id).await?;
    let left: Vec<(String, String)> =
        provider.volumes_tagged(&by_uid).await?.iter().map(|v| (tag(v, tags::DISK), tag(v, tags::RETAINED))).collect();
    assert_eq!(left, vec![("keep".to_string(), "true".to_string())], "only the retained volume outlives the instance");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upcloud_disks_are_created_storages_and_retain_is_detached_before_delete() -> TestResult {
    let double = UpcloudDouble::start(DoubleConfig::default()).await;
    let dir = tempfile::tempdir()?;
    let config = ProviderConfig {
        name: "double".into(),
        provider_type: "upcloud".into(),
        zone: "de-fra1".into(),
        endpoint: double.endpoint.clone(),
        credentials: Credentials(
            [("UPCLOUD_USERNAME".to_string(), "api-user".to_string()), ("UPCLOUD_PASSWORD".to_string(), "api-password".to_string())].into(),
        ),
        rate_limit: 100,
        state_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let provider = build_provider(&config)?;
    let created = provider.ensure_server(&request("u-disks", "", "hdd", (10, 20))).await?;
    let create = double.journal().into_iter().find(|r| r.method == "POST" && r.path == "/1.3/server").ok_or("no create")?;
    let body: serde_json::Value = serde_json::from_str(&create.body)?;
    let devices = body["server"]["storage_devices"]["storage_device"].as_array().ok_or("no devices")?;
    let extra: Vec<(String, u64, String, String)> = devices
        .iter()
        .filter(|d| d["action"] == "create")
        .map(|d| {
            let text = |k: &str| d[k].as_str().unwrap_or_default().to_string();
            (text("title"), d["size"].as_u64().unwrap_or_default(), text("tier"), text("storage"))
        })
        .collect();
    assert_eq!(extra.len(), 2, "{devices:?}");
    assert!(extra[0].0.starts_with("data-") && extra[0].1 == 10 && extra[0].2 == "maxiops" && extra[0].3.is_empty(), "{extra:?}");
    assert!(extra[1].0.starts_with("retain:keep-") && extra[1].1 == 20 && extra[1].2 == "hdd", "{extra:?}");
    assert_eq!(double.storages().len(), 3, "boot disk and two extra disks");

    delete_until_gone(provider.as_ref(), &created.provider_id).await?;
    let left = double.storages();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].0.starts_with("retain:keep-") && left[0].1 == 20, "{left:?}");
    let order: Vec<String> = double
        .journal()
        .iter()
        .filter(|r| r.path.ends_with("/storage/detach") || r.method == "DELETE")
        .map(|r| format!("{} {}", r.method, r.path.rsplit('/').next().unwrap_or_default()))
        .collect();
    assert_eq!(order.first().map(String::as_str), Some("POST detach"), "detach comes before the delete: {order:?}");
    assert_eq!(order.last().map(|o| o.starts_with("DELETE")), Some(true), "{order:?}");
    Ok(())
}

#[tokio::test]
async fn simulated_machines_keep_retained_disks_as_volumes() -> TestResult {
    let dir = tempfile::tempdir()?;
    let config =
        ProviderConfig { name: "sim".into(), provider_type: "simulated".into(), state_dir: dir.path().to_path_buf(), ..Default::default() };
    let provider = provisioning_providers::simulated::SimulatedProvider::open(&config)?;
    let created = provider.ensure_server(&request("s-disks", "", "local", (10, 20))).await?;
    let (attached, retained) = provider.disks()?;
    assert_eq!(attached.iter().map(|(_, d)| (d.name.as_str(), d.size_gib)).collect::<Vec<_>>(), vec![("data", 10), ("keep", 20)]);
    assert!(retained.is_empty());
    delete_until_gone(&provider, &created.provider_id).await?;
    let (attached, retained) = provider.disks()?;
    assert!(attached.is_empty());
    assert_eq!(retained.iter().map(|v| (v.name.as_str(), v.size_gib)).collect::<Vec<_>>(), vec![("keep", 20)]);
    assert_eq!(retained[0].tags.get(tags::SERVER_UID).map(String::as_str), Some("s-disks"));
    Ok(())
}
