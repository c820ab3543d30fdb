-- Resume reconciling this resource.
if obj.metadata.annotations ~= nil then
  obj.metadata.annotations["provisioning.dev/paused"] = nil
end
return obj
