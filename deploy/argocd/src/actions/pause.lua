-- Stop reconciling this resource; the controller reports a Paused condition.
if obj.metadata.annotations == nil then
  obj.metadata.annotations = {}
end
obj.metadata.annotations["provisioning.dev/paused"] = "true"
return obj
