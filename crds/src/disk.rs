//! Extra disks of a Server or pool (`spec.disks[]`), and the one check of them that admission
//! (the schema below), the controller and `provisioning plan` share ([`check_disks`]).

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use crate::ProviderType;

/// Most extra disks of one Server (or of each member of a pool).
pub const MAX_DISKS: usize = 16;
/// Largest disk: 16 TiB (EBS gp3's and UpCloud's own ceilings are at or above it).
pub const MAX_DISK_GIB: u64 = 16 * 1024;

/// An extra disk at the provider, made with the machine (the root disk's size comes from the
/// plan). Mounted at `mountPath`, or left raw (unformatted, e.g. for rook-ceph) without it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.mountPath) || (self.mountPath.startsWith('/') && self.mountPath != '/' && !self.mountPath.contains('..') && !self.mountPath.contains('//'))",
     "message": "mountPath must be an absolute path other than / without .. or //"}
]))]
pub struct Disk {
    /// Name of the disk, unique among the Server's disks (a DNS label); tagged on the volume.
    #[schemars(schema_with = "crate::dns1123_label")]
    pub name: String,
    /// Size in whole GiB or TiB: `100Gi`, `2Ti` (1Gi to 16Ti).
    #[schemars(schema_with = "disk_size")]
    pub size: String,
    /// Provider tier. aws: gp3 (default), gp2, io1, io2, st1, sc1; upcloud: maxiops (default),
    /// standard, hdd; local and simulated: `local` or empty.
    #[serde(default, rename = "type", skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 32), regex(pattern = r"^[a-z0-9]*$"))]
    pub disk_type: String,
    /// Where the disk is mounted on the machine. Empty: a raw disk. Local machines need it
    /// (a Docker volume is a directory); aws and upcloud disks are attached raw for now
    /// (a mountPath is refused there).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 256))]
    pub mount_path: String,
    /// What deleting the Server (or the disk's machine) does to the disk: Delete (default) or
    /// Retain (the volume stays at the provider, marked retained).
    #[serde(default)]
    pub deletion_policy: DiskDeletionPolicy,
}

/// What happens to a disk when its machine is deleted.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DiskDeletionPolicy {
    /// The disk goes with the machine.
    #[default]
    Delete,
    /// The disk stays at the provider (detached, marked retained) for someone to reuse or delete.
    Retain,
}

impl Disk {
    /// The size in GiB (the disk's `size` checked by [`disk_size_gib`]).
    pub fn size_gib(&self) -> Result<u64, String> {
        disk_size_gib(&self.size)
    }
}

/// Schema of a disk's `size`: 1Gi..16384Gi or 1Ti..16Ti, written as a whole number.
pub fn disk_size(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 7,
        "pattern": "^(([1-9][0-9]{0,3}|1[0-5][0-9]{3}|16[0-2][0-9]{2}|163[0-7][0-9]|1638[0-4])Gi|([1-9]|1[0-6])Ti)$"
    })
}

/// Schema of a `disks` list: at most [`MAX_DISKS`], merged per disk name.
pub fn disks_schema(generator: &mut SchemaGenerator) -> Schema {
    let item = generator.subschema_for::<Disk>();
    json_schema!({
        "type": "array",
        "maxItems": MAX_DISKS,
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"]
    })
}

/// The size of a disk in GiB: `<n>Gi` or `<n>Ti`, 1Gi to 16Ti (other quantity suffixes are
/// refused: a disk is sold by the GiB).
pub fn disk_size_gib(size: &str) -> Result<u64, String> {
    let (digits, unit) = match (size.strip_suffix("Gi"), size.strip_suffix("Ti")) {
        (Some(d), _) => (d, 1),
        (_, Some(d)) => (d, 1024),
        _ => return Err(format!("{size:?} is not a size in Gi or Ti (e.g. 100Gi, 2Ti)")),
    };
    let ok_digits = !digits.is_empty() && digits.len() <= 5 && digits.bytes().all(|b| b.is_ascii_digit()) && !digits.starts_with('0');
    let gib = ok_digits.then(|| digits.parse::<u64>().ok()).flatten().map(|n| n * unit);
    match gib {
        Some(g) if (1..=MAX_DISK_GIB).contains(&g) => Ok(g),
        Some(_) => Err(format!("{size:?} is outside 1Gi..16Ti")),
        None => Err(format!("{size:?} is not a whole number of Gi or Ti (e.g. 100Gi, 2Ti)")),
    }
}

/// The disk types a provider accepts (the first is its default); empty: any.
pub fn disk_types(provider: ProviderType) -> &'static [&'static str] {
    match provider {
        ProviderType::Aws => &["gp3", "gp2", "io1", "io2", "st1", "sc1"],
        ProviderType::Upcloud => &["maxiops", "standard", "hdd"],
        ProviderType::Local | ProviderType::Simulated => &["local"],
    }
}

/// Checks `disks` (pure) as admission does, plus what depends on the provider: at most
/// [`MAX_DISKS`], names DNS labels and unique, sizes 1Gi..16Ti, the type one of the
/// provider's, `mountPath` absolute (not `/`, no `..`), and on local machines a mount path
/// (a Docker volume cannot be a raw block device). The error names the field
/// (`spec.disks[i].size`) and says what is wrong; `field` is the list's path (`spec.disks`).
pub fn check_disks(field: &str, disks: &[Disk], provider: Option<ProviderType>) -> Result<(), String> {
    if disks.len() > MAX_DISKS {
        return Err(format!("{field} lists {} disks; at most {MAX_DISKS}", disks.len()));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, d) in disks.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let label = !d.name.is_empty()
            && d.name.len() <= 63
            && d.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !d.name.starts_with('-')
            && !d.name.ends_with('-');
        if !label {
            return Err(format!("{at}.name {:?} is not a DNS label (lower-case letters, digits and '-', at most 63)", d.name));
        }
        if !seen.insert(d.name.as_str()) {
            return Err(format!("{at}.name {:?} is used by another disk of the list", d.name));
        }
        d.size_gib().map_err(|e| format!("{at}.size: {e}"))?;
        if !d.mount_path.is_empty() {
            let path = &d.mount_path;
            let bad = !path.starts_with('/')
                || path == "/"
                || path.len() > 256
                || path.split('/').any(|c| c == ".." || c == ".")
                || path.contains("//")
                || path.chars().any(|c| c.is_control() || c.is_whitespace());
            if bad {
                return Err(format!("{at}.mountPath {path:?} must be an absolute path other than / (no . or .. components, no spaces)"));
            }
        }
        let Some(provider) = provider else { continue };
        let types = disk_types(provider);
        if !d.disk_type.is_empty() && !types.contains(&d.disk_type.as_str()) {
            return Err(format!("{at}.type {:?} is not a {} disk type: one of {}", d.disk_type, provider.as_str(), types.join(", ")));
        }
        let gib = d.size_gib().unwrap_or_default();
        if provider == ProviderType::Upcloud && !(10..=4096).contains(&gib) {
            return Err(format!("{at}.size {:?}: UpCloud storages are 10Gi to 4096Gi", d.size));
        }
        if matches!(provider, ProviderType::Aws | ProviderType::Upcloud) && !d.mount_path.is_empty() {
            return Err(format!(
                "{at}.mountPath {:?}: {} disks are attached raw (formatting and mounting on the machine is not done yet): leave mountPath empty and mount it from a task script",
                d.mount_path,
                provider.as_str()
            ));
        }
        if provider == ProviderType::Local && d.mount_path.is_empty() {
            return Err(format!(
                "{at}.mountPath is empty (a raw disk) but local machines have no raw disks (a Docker volume is a directory): set a mountPath"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(name: &str, size: &str) -> Disk {
        Disk { name: name.into(), size: size.into(), ..Default::default() }
    }

    #[test]
    fn sizes_are_whole_gi_or_ti_within_bounds() {
        assert_eq!(disk_size_gib("1Gi"), Ok(1));
        assert_eq!(disk_size_gib("100Gi"), Ok(100));
        assert_eq!(disk_size_gib("2Ti"), Ok(2048));
        assert_eq!(disk_size_gib("16Ti"), Ok(MAX_DISK_GIB));
        assert_eq!(disk_size_gib("16384Gi"), Ok(MAX_DISK_GIB));
        for bad in ["", "0Gi", "17Ti", "16385Gi", "100", "100G", "1.5Gi", "-1Gi", "010Gi", "Gi", "99999999999999999999Gi", "100Mi"] {
            assert!(disk_size_gib(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_schema_pattern_accepts_exactly_the_sizes_the_check_accepts() {
        let schema = serde_json::to_value(disk_size(&mut SchemaGenerator::default())).unwrap_or_default();
        let pattern = regex::Regex::new(schema["pattern"].as_str().unwrap_or("^$")).unwrap_or_else(|e| panic!("{e}"));
        let mut sizes: Vec<String> = (0..=17_000).map(|n| format!("{n}Gi")).collect();
        sizes.extend((0..=20).map(|n| format!("{n}Ti")));
        sizes.extend(["", "1G", "01Gi", "1.0Gi", "1gi"].map(String::from));
        for s in sizes {
            assert_eq!(pattern.is_match(&s), disk_size_gib(&s).is_ok(), "{s:?}");
        }
    }

    #[test]
    fn disks_are_checked_field_by_field() {
        let two = [disk("data", "100Gi"), Disk { mount_path: "/var/lib/data".into(), ..disk("logs", "10Gi") }];
        assert_eq!(check_disks("spec.disks", &two, None), Ok(()));
        assert_eq!(check_disks("spec.disks", &two[..1], Some(ProviderType::Aws)), Ok(()));
        assert_eq!(check_disks("spec.disks", &[], Some(ProviderType::Local)), Ok(()));
        let cases: Vec<(Vec<Disk>, Option<ProviderType>, &str)> = vec![
            (vec![disk("data", "1Gi"), disk("data", "2Gi")], None, "spec.disks[1].name"),
            (vec![disk("Data", "1Gi")], None, "spec.disks[0].name"),
            (vec![disk("-a", "1Gi")], None, "spec.disks[0].name"),
            (vec![disk("a", "0Gi")], None, "spec.disks[0].size"),
            (vec![disk("a", "17Ti")], None, "spec.disks[0].size"),
            (vec![Disk { mount_path: "/".into(), ..disk("a", "1Gi") }], None, "spec.disks[0].mountPath"),
            (vec![Disk { mount_path: "data".into(), ..disk("a", "1Gi") }], None, "spec.disks[0].mountPath"),
            (vec![Disk { mount_path: "/data/../etc".into(), ..disk("a", "1Gi") }], None, "spec.disks[0].mountPath"),
            (vec![Disk { disk_type: "maxiops".into(), ..disk("a", "1Gi") }], Some(ProviderType::Aws), "spec.disks[0].type"),
            (vec![Disk { disk_type: "gp3".into(), ..disk("a", "1Gi") }], Some(ProviderType::Upcloud), "spec.disks[0].type"),
            (vec![disk("raw", "1Gi")], Some(ProviderType::Local), "spec.disks[0].mountPath"),
            (vec![Disk { mount_path: "/data".into(), ..disk("a", "10Gi") }], Some(ProviderType::Aws), "spec.disks[0].mountPath"),
            (vec![disk("a", "5Gi")], Some(ProviderType::Upcloud), "spec.disks[0].size"),
            (vec![disk("a", "5Ti")], Some(ProviderType::Upcloud), "spec.disks[0].size"),
            ((0..17).map(|i| disk(&format!("d{i}"), "1Gi")).collect(), None, "at most 16"),
        ];
        for (disks, provider, names) in cases {
            let e = check_disks("spec.disks", &disks, provider).expect_err(names);
            assert!(e.contains(names), "{names}: {e}");
        }
        let upcloud = [Disk { disk_type: "hdd".into(), ..disk("a", "10Gi") }];
        assert_eq!(check_disks("spec.disks", &upcloud, Some(ProviderType::Upcloud)), Ok(()));
        let local = [Disk { disk_type: "local".into(), mount_path: "/srv".into(), ..disk("a", "1Gi") }];
        assert_eq!(check_disks("spec.disks", &local, Some(ProviderType::Local)), Ok(()));
    }
}
