//! The kstatus-style judge over the status snapshots: InProgress (never Current) before the
//! work is done, Failed when stalled, Terminating while deleted.

use provisioning_deploy_checks::{kstatus, snapshots};

#[test]
fn the_judge_gives_the_expected_verdict_for_every_snapshot() {
    let all = snapshots::load().unwrap_or_else(|e| panic!("{e}"));
    let mut failures = Vec::new();
    for snapshot in &all {
        let obj = snapshots::object(snapshot).unwrap_or_else(|e| panic!("{e}"));
        let judgement = kstatus::judge(&obj);
        if judgement.status != snapshot.kstatus {
            failures.push(format!("{} ({}): expected {:?}, got {judgement:?}", snapshot.path, snapshot.stage, snapshot.kstatus));
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_stage_before_done_is_in_progress_for_every_kind() {
    let all = snapshots::load().unwrap_or_else(|e| panic!("{e}"));
    for stage in ["progressing_noStatus", "progressing_firstVisit", "progressing_reconciling", "progressing_specChanged"] {
        let matching: Vec<_> = all.iter().filter(|s| s.path.ends_with(&format!("/{stage}.yaml"))).collect();
        assert_eq!(matching.len(), 4, "{stage}: one snapshot per kind");
        for snapshot in matching {
            let obj = snapshots::object(snapshot).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(kstatus::judge(&obj).status, kstatus::KStatus::InProgress, "{}", snapshot.path);
        }
    }
}
