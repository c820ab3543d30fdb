-- Generated from deploy/argocd/src/actions/resume.lua by scripts/gen-argocd.sh: edit that file, not this copy.
-- Resume reconciling this resource. The annotation is set to "false" rather than removed:
-- Argo CD turns a table the script emptied back into the map it was, undoing the removal.
if obj.metadata.annotations ~= nil and obj.metadata.annotations["provisioning.dev/paused"] ~= nil then
  obj.metadata.annotations["provisioning.dev/paused"] = "false"
end
return obj
