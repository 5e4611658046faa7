-- Argo CD health of a gputenancy.io GpuTenant (written by the gpu-tenancy controller).
--
-- Install as Argo CD's resource_customizations/gputenancy.io/GpuTenant/health.lua, or paste into
-- argocd-cm as resource.customizations.health.gputenancy.io_GpuTenant. It needs no Lua standard
-- library beyond what Argo CD always loads (no string functions), so it runs the same both ways.
--
-- The conditions follow kstatus (README "Resources"); they are read in this order:
--   no status, or no status.observedGeneration   Progressing  the controller has not seen it yet
--   observedGeneration differs from generation    Progressing  the controller has not seen this spec
--   Stalled=True                                  Degraded     a person must act; the message says
--                                                              what, with the Valid condition's
--                                                              field and problem when invalid
--   Reconciling=True                              Progressing  with its message
--   Ready=True                                    Healthy      with its message ("4 of 4 units granted")
--   Ready=False and CapacityShort=True            Degraded     with the shortfall (see below)
--   Ready=False or Unknown otherwise, or no Ready Progressing
--
-- Stalled is read before Reconciling, so Degraded wins when both are True; kstatus (Flux) takes
-- whichever comes first in the list, and the controller sorts conditions by type, so it reports
-- such an object InProgress until the reconciling ends.
--
-- CapacityShort: the tenant is valid and nothing is in motion, but the fleet cannot give it all it
-- asks for (Ready=False, reason CapacityShort). That does not change by waiting for the
-- controller: it takes more GPUs, a smaller request or a higher priority. Meanwhile the tenant's
-- ResourceQuota holds it to what was granted, so some of its pods are refused. Argo CD shows it
-- Degraded, and a sync wave that holds the tenant fails with the shortfall as its message instead
-- of waiting on a Progressing resource until the sync times out. (kstatus reads Ready=False as
-- InProgress, so a Flux health check on such a tenant waits until its timeout.)
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

local short = condition("CapacityShort")
if ready ~= nil and ready.status == "False" and short ~= nil and short.status == "True" then
  hs.status = "Degraded"
  hs.message = text(short)
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = text(ready)
else
  hs.message = "waiting for the controller to set Ready"
end
return hs
