-- Generated from deploy/argocd/src/actions/discovery.lua by scripts/gen-argocd.sh: edit that file, not this copy.
-- Actions offered on a provisioning.dev resource: reconcile now, pause and resume.
local paused = obj.metadata.annotations ~= nil and obj.metadata.annotations["provisioning.dev/paused"] == "true"
local deleting = obj.metadata.deletionTimestamp ~= nil
local actions = {}
actions["reconcile"] = {
  ["displayName"] = "Reconcile now",
  ["iconClass"] = "fa fa-fw fa-rotate-right",
  ["disabled"] = paused or deleting
}
actions["pause"] = {
  ["displayName"] = "Pause reconciliation",
  ["iconClass"] = "fa fa-fw fa-pause-circle",
  ["disabled"] = paused or deleting
}
actions["resume"] = {
  ["displayName"] = "Resume reconciliation",
  ["iconClass"] = "fa fa-fw fa-play-circle",
  ["disabled"] = not paused
}
return actions
