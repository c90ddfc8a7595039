-- fusebox breaker state machine, run atomically inside Redis (one call per
-- operation). The transition is decided here, so replicas sharing Redis act
-- on one state and the half-open probe bound is global. It mirrors
-- pkg/breaker/machine.go; the contract suite (pkg/breaker/storetest) holds
-- both to the same behaviour.
--
-- KEYS[1]  the breaker's state (a JSON object), hash-tagged by the caller.
-- ARGV[1]  operation: rec | acq | rel | adv | snap | fo | fc | rst | merge
-- ARGV[2]  now, unix milliseconds (the caller's clock: see doc.go). Lua
--          numbers are doubles and cjson keeps 14 digits: milliseconds stay
--          exact, nanoseconds would not.
-- ARGV[3]  the installed policy (a MessagePack array), then the
--          operation's arguments.
local key = KEYS[1]
local op = ARGV[1]
-- ARGV[2] is "<now>:<wall>": the caller's clock and its wall clock when it
-- sent the call, in ms. One clock for the fleet (R-ST9): when the caller's
-- wall clock is off Redis's own (TIME) by more than half a second, the
-- call's time is moved by that skew, so cooldowns, probe leases and
-- windows expire on Redis's time, not on whichever replica's clock ran
-- ahead; a record queued for a while keeps its age (it is applied at the
-- time it happened). Within half a second the caller's time stands, so a
-- test's fake clock stays exact.
local now = tonumber(ARGV[2])
do
  local sep = string.find(ARGV[2], ":", 1, true)
  if sep then
    now = tonumber(string.sub(ARGV[2], 1, sep - 1))
    local wall = tonumber(string.sub(ARGV[2], sep + 1))
    local t = redis.call("TIME")
    local skew = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - wall
    if skew > 500 or skew < -500 then now = now + skew end
  end
end
-- The policy comes packed (MessagePack, encoded once per config load):
-- one argument instead of twenty to convert.
local pa = cmsgpack.unpack(ARGV[3])
local P = {
  active = pa[1], shadow = pa[2], threshold = pa[3], window_sec = pa[4], cooldown = pa[5],
  sliding = pa[6], consecutive = pa[7], rate = pa[8], rate_sec = pa[9], min_req = pa[10],
  slow_ms = pa[11], slow_rate = pa[12], max_probes = pa[13], probe_timeout = pa[14],
  mult = pa[15], max_cooldown = pa[16], version = pa[17], ttl_ms = pa[18],
  tracks_slow = pa[19], stall = pa[20],
}
local A = 4 -- first operation argument

-- The state's schema: sv 1 is this script's (a state without sv, written
-- by an earlier fusebox, reads the same). A state that does not decode, or
-- does not have the shape below (garbage, another type under the key, a
-- version whose fields this script cannot read), is rewritten as a fresh
-- closed breaker and the reply says so: one bad key is that breaker's
-- problem, never an error that would turn the whole store degraded (R-L12).
local SV = 1
-- The incarnation names one life of the key: a key that vanished (expiry,
-- eviction, FLUSHALL, a failover to a lagging replica) comes back with
-- another one, and a replica then takes its state whatever sequence its
-- view held (R-ST8). Redis's own clock makes it unique per creation.
local function incarnation()
  local t = redis.call("TIME")
  return t[1] .. "." .. t[2]
end
local function fresh()
  return {sv = SV, st = 0, gen = 1, reason = "", oa = 0, ra = 0, rc = 0, ou = 0, fo = 0, fu = 0, bu = 0,
          cons = 0, tc = 0, te = 0, fw = {}, rw = {}, ls = {}, nl = 0, sb = "", v = 0, inc = incarnation()}
end
local function buckets_ok(w)
  if type(w) ~= "table" then return false end
  for k, b in pairs(w) do
    if tonumber(k) == nil or type(b) ~= "table" or type(b[1]) ~= "number" or type(b[2]) ~= "number"
      or type(b[3]) ~= "number" then return false end
  end
  return true
end
local function readable(d)
  if type(d) ~= "table" then return false end
  for _, f in ipairs({"st", "gen", "oa", "ra", "rc", "ou", "fo", "fu", "bu", "cons", "tc", "te", "nl", "lc"}) do
    if d[f] == nil then d[f] = 0 end
    if type(d[f]) ~= "number" then return false end
  end
  for _, f in ipairs({"reason", "sb"}) do
    if d[f] == nil then d[f] = "" end
    if type(d[f]) ~= "string" then return false end
  end
  for _, f in ipairs({"fw", "rw", "ls"}) do
    if d[f] == nil then d[f] = {} end
  end
  if d.v ~= nil and type(d.v) ~= "number" then return false end
  if d.inc ~= nil and type(d.inc) ~= "string" then return false end
  if d.st < 0 or d.st > 2 or d.gen < 1 or not buckets_ok(d.fw) or not buckets_ok(d.rw) then return false end
  for _, exp in pairs(d.ls) do if type(exp) ~= "number" then return false end end
  return true
end
local rewritten = 0
-- created: the state was made here (no key, or one rewritten); it is
-- written even by snap, so that its incarnation stays one.
local created = false
local raw = redis.pcall("GET", key)
local s
if type(raw) == "table" and raw.err then
  -- Another type under the key (WRONGTYPE).
  redis.call("DEL", key)
  s = fresh(); rewritten = 1; created = true
elseif raw then
  local ok, d = pcall(cmsgpack.unpack, raw) -- MessagePack: cheaper than JSON in Redis's Lua
  if ok and readable(d) then s = d else s = fresh(); rewritten = 1; created = true end
else
  s = fresh(); created = true
end
local made = created -- a fresh state (no key, or one rewritten)
if s.inc == nil then
  -- Written by an earlier fusebox: it gets its incarnation now.
  s.inc = incarnation(); created = true
end
if made and op == "rec" then
  -- The outcome being recorded was admitted under the generation the
  -- caller's view held; a state made now takes it, so that it counts
  -- (after a key vanished, the first failure must open it again).
  local g = tonumber(ARGV[A + 4])
  if g and g >= 1 then s.gen = g end
end
local events = {}
-- The decision state's signature: when a call changes it, the view
-- sequence (v) grows and the caller publishes the snapshot to the other
-- replicas (R-ST2).
local function sig()
  return table.concat({s.st, s.gen, s.fo, s.fu, s.ou, s.bu, s.reason}, "|")
end
local before = sig()
s.v = s.v or 0

-- Sliding windows: buckets of `width` seconds, at most 120 of them, keyed by
-- bucket number (as in machine.go's sliding). Each window is pruned once
-- per call, and its totals kept from then on.
local pruned = {}
local function win_prune(w, size)
  if pruned[w] then return end
  local width = math.floor((size + 119) / 120)
  local n = math.floor((size + width - 1) / width)
  local cur = math.floor(math.floor(now / 1000) / width)
  local c, f, sl = 0, 0, 0
  for k, b in pairs(w) do
    if cur - tonumber(k) >= n then w[k] = nil else c = c + b[1]; f = f + b[2]; sl = sl + b[3] end
  end
  pruned[w] = {c, f, sl, tostring(cur)}
end

local function win_add(w, size, c, f, sl)
  win_prune(w, size)
  local t = pruned[w]
  local k = t[4]
  local b = w[k] or {0, 0, 0}
  b[1] = b[1] + c; b[2] = b[2] + f; b[3] = b[3] + sl
  w[k] = b
  t[1] = t[1] + c; t[2] = t[2] + f; t[3] = t[3] + sl
end

local function win_totals(w, size)
  win_prune(w, size)
  local t = pruned[w]
  return t[1], t[2], t[3]
end

local function failures()
  if P.sliding then
    local _, f = win_totals(s.fw, P.window_sec)
    return f
  end
  if s.te ~= 0 and now >= s.te then s.tc = 0; s.te = 0 end
  return s.tc
end

local function lease_count()
  local n = 0
  for _, _ in pairs(s.ls) do n = n + 1 end
  return n
end

local function emit(from, reason)
  local c, f = win_totals(s.rw, P.rate_sec)
  local ou = 0
  if s.st == 1 then ou = s.ou end
  table.insert(events, {from = from, to = s.st, reason = reason, failures = failures(), ou = ou,
    forever = (s.fo == 1 and s.fu == 0) and 1 or 0, oa = s.oa, rc = s.rc, calls = c, fails = f, gen = s.gen})
end

local function cooldown_for(k)
  local cd = P.cooldown
  if P.mult > 1 then
    local i = 1
    while i < k and cd < P.max_cooldown do cd = cd * P.mult; i = i + 1 end
    if cd > P.max_cooldown then cd = P.max_cooldown end
  end
  return math.floor(cd)
end

local function open(reason)
  local from = s.st
  s.st = 1; s.reason = reason; s.oa = now; s.ra = 0; s.rc = 0; s.ca = 0
  s.ou = now + cooldown_for(1)
  s.gen = s.gen + 1
  emit(from, reason)
end

local function reopen(reason)
  local from = s.st
  s.st = 1; s.reason = reason; s.ra = now; s.rc = s.rc + 1
  s.ou = now + cooldown_for(s.rc + 1)
  s.ls = {}
  s.gen = s.gen + 1
  emit(from, reason)
end

local function close(reason)
  local from = s.st
  s.st = 0; s.reason = ""; s.oa = 0; s.ra = 0; s.rc = 0; s.ou = 0
  -- The close a recovery ramp is measured from (R-D8): the store holds it,
  -- so every replica ramps from the same time.
  s.ca = 0
  if from == 2 and reason == "probe_success" then s.ca = now end
  -- lc: the last close of any kind; a write-back never reopens over it
  -- with an older open (merge).
  s.lc = now
  s.cons = 0; s.tc = 0; s.te = 0; s.fw = {}; s.rw = {}; s.ls = {}
  if from ~= 0 then
    s.gen = s.gen + 1
    emit(from, reason)
  end
end

local function advance()
  if s.fo == 1 then
    if s.fu ~= 0 and now >= s.fu then
      s.fo = 0; s.fu = 0
      close("force_expired")
    end
  elseif s.st == 1 and now >= s.ou then
    s.st = 2; s.ls = {}; s.gen = s.gen + 1
    emit(1, "cooldown_elapsed")
  end
  for id, exp in pairs(s.ls) do
    if exp <= now then s.ls[id] = nil end
  end
  if s.bu ~= 0 and now >= s.bu then s.bu = 0 end
end

local function check_rates()
  if s.st ~= 0 or (P.rate <= 0 and not P.tracks_slow) then return end
  local c, f, sl = win_totals(s.rw, P.rate_sec)
  if c < P.min_req then return end
  if P.rate > 0 and f * 100 >= P.rate * c then
    open("failure_rate")
  elseif P.tracks_slow and sl > 0 and sl * 100 >= P.slow_rate * c then
    local r = "slow_call_rate"
    if s.sb == "stall" then r = "slow_call_rate:stall" elseif s.sb == "baseline" then r = "slow_call_rate:baseline" end
    open(r)
  end
end

-- verdict: 0 healthy, else the recovery time (math.huge = never).
local function recovery_at()
  local rec = 0
  if s.fo == 1 then
    if s.fu ~= 0 then rec = s.fu else rec = -1 end
  elseif s.st == 1 then
    rec = s.ou
  elseif s.st == 2 and P.max_probes > 0 and lease_count() >= P.max_probes then
    local e = 0
    for _, exp in pairs(s.ls) do if e == 0 or exp < e then e = exp end end
    rec = e
  end
  if rec ~= -1 and s.bu > now and s.bu > rec then rec = s.bu end
  return rec
end

local res = {ok = 1, lease = 0, stale = 0}

if op == "rec" then
  -- A: class (0 neither, 1 success, 2 failure), reason, slow, open_now,
  --    admission gen, lease, retry-after deadline (0 = none), route scope
  --    (1: Retry-After may block), status, block on Retry-After, max retry-after s
  local class = tonumber(ARGV[A]); local reason = ARGV[A + 1]; local slow = ARGV[A + 2] == "1"
  local open_now = ARGV[A + 3] == "1"; local agen = tonumber(ARGV[A + 4]); local lease = ARGV[A + 5]
  local ra = tonumber(ARGV[A + 6]); local route_scope = ARGV[A + 7] == "1"; local status = tonumber(ARGV[A + 8])
  local block = ARGV[A + 9] == "1"; local max_ra = tonumber(ARGV[A + 10])
  local slow_by = ARGV[A + 11]; local counted = ARGV[A + 12] == "1"
  if lease ~= "0" then s.ls[lease] = nil end
  advance()
  if route_scope and ra ~= 0 and block and (status == 429 or status == 503) then
    local limit = now + max_ra * 1000
    if ra > limit then ra = limit end
    if ra > s.bu and ra > now then s.bu = ra end
  end
  if agen ~= s.gen then
    res.stale = 1
  elseif s.st == 0 then
    if class ~= 0 then
      local failed = class == 2
      if counted then
        win_add(s.rw, P.rate_sec, 0, failed and 1 or 0, 0)
      else
        win_add(s.rw, P.rate_sec, 1, failed and 1 or 0, slow and 1 or 0)
      end
      if slow then s.sb = slow_by end
      if not failed then
        s.cons = 0
        check_rates()
      else
        s.cons = s.cons + 1
        local count
        if P.sliding then
          win_add(s.fw, P.window_sec, 0, 1, 0)
          local _, f = win_totals(s.fw, P.window_sec)
          count = f
        else
          if s.te ~= 0 and now >= s.te then s.tc = 0; s.te = 0 end
          if s.tc == 0 then s.te = now + 2 * P.window_sec * 1000 end
          s.tc = s.tc + 1
          count = s.tc
        end
        if open_now or count >= P.threshold or (P.consecutive > 0 and s.cons >= P.consecutive) then
          open(reason)
        else
          check_rates()
        end
      end
    end
  elseif s.st == 2 then
    if class == 1 then close("probe_success") elseif class == 2 then reopen(reason) end
  end
elseif op == "acq" then
  local force = ARGV[A] == "1"
  advance()
  if P.shadow or not P.active then
    -- admitted, no slot
  elseif s.st == 2 and s.fo == 0 and P.max_probes > 0 and s.bu <= now then
    if lease_count() < P.max_probes then
      s.nl = s.nl + 1
      s.ls[tostring(s.nl)] = now + P.probe_timeout
      res.lease = s.nl
    elseif not force then
      res.ok = 0
    end
  elseif not force then
    if recovery_at() ~= 0 then res.ok = 0 end
  end
elseif op == "stl" then
  advance()
  if P.active and s.st == 0 and P.stall > 0 then
    win_add(s.rw, P.rate_sec, 1, 0, 1)
    s.sb = "stall"
    check_rates()
  end
elseif op == "rel" then
  s.ls[ARGV[A]] = nil
elseif op == "adv" or op == "snap" then
  -- snap is the periodic refresh: it writes only when a due transition
  -- changes something.
  advance()
elseif op == "merge" then
  -- Write-back after an outage (R-ST4): an open a replica learned on its
  -- own while Redis was unreachable, or one Redis lost (it went back to
  -- an older state: healBehind). The later of two opens wins, and an open
  -- older than Redis's last close (an operator's, a probe's) is not put
  -- back over it.
  -- A: forced, forced until, opened at, open until, reopens, reason, blocked until
  local lfo = ARGV[A] == "1"; local lfu = tonumber(ARGV[A + 1]); local loa = tonumber(ARGV[A + 2])
  local lou = tonumber(ARGV[A + 3]); local lrc = tonumber(ARGV[A + 4]); local lreason = ARGV[A + 5]
  local lbu = tonumber(ARGV[A + 6])
  advance()
  if lbu > s.bu and lbu > now then s.bu = lbu end
  local live = lfo and (lfu == 0 or lfu > now) or (not lfo and lou > now)
  if live and (s.st ~= 1 or loa > s.oa) and s.fo == 0 and loa > s.lc then
    local from = s.st
    s.st = 1; s.reason = lreason; s.oa = loa; s.ra = 0; s.rc = lrc; s.ou = lou
    if lfo then s.fo = 1; s.fu = lfu; s.ou = lfu end
    s.ls = {}
    s.gen = s.gen + 1
    if from ~= 1 then emit(from, lreason) end
  end
elseif op == "fo" then
  local d = tonumber(ARGV[A])
  local from = s.st
  s.fo = 1; s.fu = 0
  if d > 0 then s.fu = now + d end
  s.st = 1; s.reason = "forced"
  if from == 0 then s.oa = now; s.ra = 0; s.rc = 0 end
  s.ou = s.fu
  s.ls = {}
  s.gen = s.gen + 1
  if from ~= 1 then emit(from, "forced") end
elseif op == "fc" or op == "rst" then
  s.fo = 0; s.fu = 0
  if op == "rst" then s.bu = 0 end
  local from = s.st
  close(op == "rst" and "reset" or "force_close")
  if from == 0 then s.gen = s.gen + 1 end
end

local changed = 0
if sig() ~= before then
  s.v = s.v + 1
  changed = 1
end
if op ~= "snap" or changed == 1 or created then
  redis.call("SET", key, cmsgpack.pack(s), "PX", P.ttl_ms)
end

local c, f, sl = win_totals(s.rw, P.rate_sec)
local earliest = 0
for _, exp in pairs(s.ls) do if earliest == 0 or exp < earliest then earliest = exp end end
-- A flat reply (no JSON to build or parse); the order is store.go's
-- reply fields. Events follow, eleven values each.
-- The reply is flat (no JSON to build or parse): REPLY's fields in that
-- order, then EVENT's for each transition. script.go reads them by the
-- same names (replyNames, eventNames); TestReplyProtocolNames holds the
-- lists equal.
local REPLY = {"ok", "lease", "stale", "state", "gen", "reason", "opened_at", "reopened_at", "reopens",
  "open_until", "forced", "forced_until", "blocked_until", "consecutive", "failures", "window_calls",
  "window_failures", "window_slow", "probes", "probes_until", "seq", "changed", "rewritten", "incarnation",
  "closed_at"}
local EVENT = {"from", "to", "reason", "failures", "open_until", "forever", "opened_at", "reopens",
  "window_calls", "window_failures", "gen"}
local reply = {ok = res.ok, lease = res.lease, stale = res.stale, state = s.st, gen = s.gen, reason = s.reason,
  opened_at = s.oa, reopened_at = s.ra, reopens = s.rc, open_until = s.ou, forced = s.fo, forced_until = s.fu,
  blocked_until = s.bu, consecutive = s.cons, failures = failures(), window_calls = c, window_failures = f,
  window_slow = sl, probes = lease_count(), probes_until = earliest, seq = s.v, changed = changed,
  rewritten = rewritten, incarnation = s.inc, closed_at = s.ca or 0}
local out = {}
for _, k in ipairs(REPLY) do table.insert(out, reply[k]) end
for _, e in ipairs(events) do
  local ev = {from = e.from, to = e.to, reason = e.reason, failures = e.failures, open_until = e.ou,
    forever = e.forever, opened_at = e.oa, reopens = e.rc, window_calls = e.calls, window_failures = e.fails,
    gen = e.gen}
  for _, k in ipairs(EVENT) do table.insert(out, ev[k]) end
end
return out
