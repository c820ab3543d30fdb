-- Actions offered on a provisioning.dev resource: reconcile now, pause, resume, and approve
-- the current plan (offered while status.plan has changes that are not approved yet).
local paused = obj.metadata.annotations ~= nil and obj.metadata.annotations["provisioning.dev/paused"] == "true"
local deleting = obj.metadata.deletionTimestamp ~= nil
local plan = nil
if obj.status ~= nil then
  plan = obj.status.plan
end
local pending = plan ~= nil and plan.id ~= nil and plan.id ~= "" and plan.changes ~= nil and #plan.changes > 0
local approved = pending and obj.metadata.annotations ~= nil and obj.metadata.annotations["provisioning.dev/approve"] == plan.id
local actions = {}
actions["approve"] = {
  ["displayName"] = "Approve plan",
  ["iconClass"] = "fa fa-fw fa-check",
  ["disabled"] = not pending or approved or deleting
}
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
