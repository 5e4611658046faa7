-- Argo CD health of a gputenancy.io GpuPartitionPlan (status written by the gpu-tenancy controller).
--
-- Install as Argo CD's resource_customizations/gputenancy.io/GpuPartitionPlan/health.lua, or paste
-- into argocd-cm as resource.customizations.health.gputenancy.io_GpuPartitionPlan. It needs no Lua
-- standard library beyond what Argo CD always loads (no string functions), so it runs the same
-- both ways.
--
-- The conditions follow kstatus (README "Resources"); they are read in this order:
--   no status, or no status.observedGeneration   Progressing  the controller has not seen it yet
--   observedGeneration differs from generation    Progressing  the controller has not seen this spec
--   Stalled=True                                  Degraded     the plan is invalid (message with the
--                                                              Valid condition's field and problem)
--                                                              or nodes cannot take it (NodesFailed;
--                                                              status.nodeDetails names them)
--   Reconciling=True                              Progressing  the rollout: "2 of 5 nodes still to
--                                                              apply the plan: ...", or nodes waiting
--                                                              for their agents
--   Ready=True                                    Healthy      every selected node applied the plan
--   Ready=False or Unknown otherwise, or no Ready Progressing
--
-- Ready=False without Stalled is Progressing: the plan is valid and no node failed, so what is
-- left (nodes still to apply it, held back by rollout.maxUnavailable, or whose agent has not
-- reported) moves on without a person. Nodes that cannot take the plan set Stalled.
--
-- Stalled is read before Reconciling: a rollout in which one node failed while others are still
-- changing is Degraded at once, with the failure as the message. kstatus (Flux) takes whichever
-- comes first in the list, and the controller sorts conditions by type, so it reports such a plan
-- InProgress until the rollout ends and Failed after.
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
