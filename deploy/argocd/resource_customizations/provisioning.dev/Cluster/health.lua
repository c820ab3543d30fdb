-- Generated from deploy/argocd/src/health.lua by scripts/gen-argocd.sh: edit that file, not this copy.
-- Health of a provisioning.dev resource, judged from the kstatus conditions the controller writes.
-- Runs without the `string` and `math` libraries (argocd-cm checks do not get them by default).
local function condition(conditionType)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == conditionType then
      return c
    end
  end
  return nil
end

-- The condition's message, or its reason when the message is empty, or a fallback.
local function describe(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if c ~= nil and c.reason ~= nil and c.reason ~= "" then
    return c.reason
  end
  return fallback
end

local hs = {}

if obj.metadata.deletionTimestamp ~= nil then
  hs.status = "Progressing"
  hs.message = "Being deleted"
  return hs
end

if obj.metadata.annotations ~= nil and obj.metadata.annotations["provisioning.dev/paused"] == "true" then
  hs.status = "Suspended"
  hs.message = describe(condition("Paused"), "Reconciliation is paused")
  return hs
end

if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the controller to observe the resource"
  return hs
end

-- generation may arrive as a number or as a numeric string; tonumber is in the base library.
local generation = tonumber(obj.metadata.generation)
local observedGeneration = tonumber(obj.status.observedGeneration)
if generation ~= nil and (observedGeneration == nil or observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the controller to observe generation " .. generation
  return hs
end

-- A plan waiting for approval (approval: Manual) is suspended until someone approves it.
local ready = condition("Ready")
if ready ~= nil and ready.status == "False" and ready.reason == "AwaitingApproval" then
  hs.status = "Suspended"
  hs.message = describe(ready, "Waiting for approval of the current plan")
  return hs
end

local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(stalled, "Stalled")
  return hs
end

local reconciling = condition("Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = describe(reconciling, "Reconciling")
  return hs
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready, "Ready")
  return hs
end
if ready ~= nil and ready.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(ready, "Not ready")
  return hs
end

hs.status = "Progressing"
hs.message = describe(ready, "Waiting for the Ready condition")
return hs
