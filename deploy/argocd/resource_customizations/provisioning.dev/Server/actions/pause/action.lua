-- Generated from deploy/argocd/src/actions/pause.lua by scripts/gen-argocd.sh: edit that file, not this copy.
-- Stop reconciling this resource; the controller reports a Paused condition.
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["provisioning.dev/paused"] = "true"
return obj
