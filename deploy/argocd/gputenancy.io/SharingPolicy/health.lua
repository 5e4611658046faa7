-- Argo CD health of a gputenancy.io SharingPolicy (status written by the gpu-tenancy controller).
--
-- Install as Argo CD's resource_customizations/gputenancy.io/SharingPolicy/health.lua, or paste
-- into argocd-cm as resource.customizations.health.gputenancy.io_SharingPolicy. It needs no Lua
-- standard library beyond what Argo CD always loads (no string functions), so it runs the same
-- both ways.
--
-- The conditions follow kstatus (README "Resources"); they are read in this order:
--   no status, or no status.observedGeneration   Progressing  the controller has not seen it yet
--   observedGeneration differs from generation    Progressing  the controller has not seen this spec
--   Stalled=True                                  Degraded     the policy is invalid; the message
--                                                              has the Valid condition's problem
--   Reconciling=True                              Progressing  with its message
--   Ready=True                                    Healthy      "the policy is in force"
--   Ready=False or Unknown otherwise, or no Ready Progressing
--
-- The controller marks every invalid policy Stalled, so Ready=False without Stalled only appears
-- between a controller's writes; it is Progressing, not a failure.
local hs = {}

local function condition(t)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == t then
      return c
    end
  end
  return nil
end

local function text(c)
  if c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if c.reason ~= nil then
    return c.reason
  end
  return c.type .. "=" .. c.status
end

if obj.status == nil or obj.status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "waiting for the controller"
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "waiting for the controller to observe generation " .. generation ..
    " (the status is of generation " .. obj.status.observedGeneration .. ")"
  return hs
end

local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = text(stalled)
  local valid = condition("Valid")
  if valid ~= nil and valid.status == "False" and valid.message ~= nil and valid.message ~= "" then
    hs.message = hs.message .. ": " .. valid.message
  end
  return hs
end

local reconciling = condition("Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.status = "Progressing"
  hs.message = text(reconciling)
  return hs
end

local ready = condition("Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = text(ready)
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = text(ready)
else
  hs.message = "waiting for the controller to set Ready"
end
return hs
