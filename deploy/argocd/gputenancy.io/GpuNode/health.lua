-- Argo CD health of a gputenancy.io GpuNode. Its spec is written by the gpu-tenancy controller, its
-- status by the node agent on that node (README "Node agent").
--
-- Install as Argo CD's resource_customizations/gputenancy.io/GpuNode/health.lua, or paste into
-- argocd-cm as resource.customizations.health.gputenancy.io_GpuNode. It needs no Lua standard
-- library beyond what Argo CD always loads (no string functions), so it runs the same both ways.
--
-- The conditions follow kstatus (README "Resources"); they are read in this order:
--   no status, or no status.observedGeneration   Progressing  the agent has not reported yet
--   observedGeneration differs from generation    Progressing  the agent has not applied this spec
--   Stalled=True                                  Degraded     the spec cannot be applied on this
--                                                              node (InvalidSpec: "the spec needs a
--                                                              fix: GPU 1 (NotFound)")
--   Reconciling=True                              Progressing  waiting for busy GPUs, a reset or a
--                                                              retry, with the GPUs not applied
--   Ready=True                                    Healthy      every GPU matches the spec; a drift
--                                                              the agent repaired (Drifted=True)
--                                                              is named in the message
--   Ready=False or Unknown otherwise, or no Ready Progressing
--
-- Ready=False without Stalled is Progressing: the GPUs that do not match are busy (busyGpuPolicy
-- Wait), wait for a reset or are retried, all of which the agent resolves without a person; what
-- needs a person sets Stalled.
--
-- Stalled is read before Reconciling, so Degraded wins when both are True; kstatus (Flux) takes
-- whichever comes first in the list (the agent sorts conditions by type), so it reports such a
-- node InProgress until the waiting ends.
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
  hs.message = "waiting for the node agent to report"
  return hs
end

local generation = obj.metadata.generation
if generation ~= nil and obj.status.observedGeneration ~= generation then
  hs.status = "Progressing"
  hs.message = "waiting for the node agent to apply generation " .. generation ..
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
  local drifted = condition("Drifted")
  if drifted ~= nil and drifted.status == "True" then
    hs.message = hs.message .. "; repaired: " .. text(drifted)
  end
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = text(ready)
else
  hs.message = "waiting for the node agent to set Ready"
end
return hs
