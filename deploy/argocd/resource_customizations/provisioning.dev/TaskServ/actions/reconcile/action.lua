-- Generated from deploy/argocd/src/actions/reconcile.lua by scripts/gen-argocd.sh: edit that file, not this copy.
-- Ask the controller to reconcile now: any new value of this annotation triggers a reconcile.
local os = require("os")
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["provisioning.dev/reconcile-requested-at"] = os.date("!%Y-%m-%dT%H:%M:%SZ")
return obj
