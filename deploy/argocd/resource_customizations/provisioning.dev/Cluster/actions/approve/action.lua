-- Generated from deploy/argocd/src/actions/approve.lua by scripts/gen-argocd.sh: edit that file, not this copy.
-- Approve the current plan: the controller carries out the plan whose id
-- provisioning.dev/approve names (under approval: Manual). On a Cluster this approves, for
-- each member Server and TaskServ, what the Cluster's plan covers (the controller sets the
-- members' own approvals). Without a plan nothing changes.
local plan = nil
if obj.status ~= nil then
  plan = obj.status.plan
end
if plan ~= nil and plan.id ~= nil and plan.id ~= "" then
  if obj.metadata.annotations == nil then
    obj.metadata.annotations = {}
  end
  obj.metadata.annotations["provisioning.dev/approve"] = plan.id
end
return obj
