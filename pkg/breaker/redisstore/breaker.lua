-- fusebox breaker state machine, run atomically inside Redis (one call per
-- operation). The transition is decided here, so replicas sharing Redis act
-- on one state and the half-open probe bound is global. It mirrors
-- pkg/breaker/machine.go; the transition vectors (pkg/breaker/vectors, from
-- SPEC §5) and the contract suite (pkg/breaker/storetest) hold both to the
-- same behaviour.
--
-- KEYS[1]  the breaker's state, hash-tagged by the caller.
-- ARGV[1]  the installed policy: a MessagePack map, packed once per config
--          load (script.go, policyArgs), read as P.
-- ARGV[2]  the call: a MessagePack map, read as A (script.go, callArgs):
--            op    rec | acq | rel | stl | adv | snap | fo | fc | rst | merge
--            age   how long ago the call's event happened, in ms (a record
--                  queued for a while is applied at the time it happened)
--            now   only in a test: the test's clock, in unix ms
--          and the operation's own arguments, by name (below, per op).
-- Times are unix milliseconds. Lua numbers are doubles and cmsgpack keeps
-- them exact to 2^53: milliseconds stay exact, nanoseconds would not.
local key = KEYS[1]
local P = cmsgpack.unpack(ARGV[1])
local A = cmsgpack.unpack(ARGV[2])
local op = A.op
-- One clock for the fleet (R-ST9, R-ST16): now is Redis's own (TIME), less
-- the event's age, so cooldowns, probe leases and windows run on one clock
-- whatever each replica's says. A test with a fake clock sends it as
-- A.now: the one way a caller's time stands.
local now = A.now
if now == nil then
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - (A.age or 0)
end

-- The state's schema: 2 is this script's, fields named in words. Schema 1
-- (an earlier fusebox, two-letter names) is read by renaming. A state that
-- does not decode, or does not have the shape below (garbage, another type
-- under the key, a schema this script cannot read), is rewritten as a
-- fresh closed breaker and the reply says so: one bad key is that
-- breaker's problem, never an error that would turn the whole store
-- degraded (R-L12).
local SCHEMA = 2
local SCHEMA1 = {st = "state", gen = "generation", oa = "opened_at", ra = "reopened_at", rc = "reopens",
  ou = "open_until", fo = "forced", fu = "forced_until", bu = "blocked_until", cons = "consecutive",
  tc = "tumbling_failures", te = "tumbling_until", fw = "failure_window", rw = "rate_window", ls = "leases",
  nl = "last_lease", sb = "slow_by", v = "seq", inc = "incarnation", lc = "last_close", ca = "closed_at"}
-- The incarnation names one life of the key: a key that vanished (expiry,
-- eviction, FLUSHALL, a failover to a lagging replica) comes back with
-- another one, and a replica then takes its state whatever sequence its
-- view held (R-ST8). Redis's own clock makes it unique per creation.
local function incarnation()
  local t = redis.call("TIME")
  return t[1] .. "." .. t[2]
end
-- state: 0 closed, 1 open, 2 half_open (machine.go's State).
local function fresh()
  return {schema = SCHEMA, state = 0, generation = 1, reason = "", opened_at = 0, reopened_at = 0, reopens = 0,
          open_until = 0, forced = 0, forced_until = 0, blocked_until = 0, saturated_until = 0, saturated_since = 0, consecutive = 0, tumbling_failures = 0,
          tumbling_until = 0, failure_window = {}, rate_window = {}, leases = {}, slow_by = "",
          seq = 0, incarnation = incarnation()}
end
-- upgrade renames a schema-1 state's fields.
local function upgrade(d)
  if type(d) ~= "table" or d.schema ~= nil and d.schema ~= 1 then return d end
  local out = {schema = SCHEMA}
  for k, v in pairs(d) do
    if k ~= "sv" then out[SCHEMA1[k] or k] = v end
  end
  return out
end
-- A window's buckets: bucket number -> {calls, failures, slow}.
local function buckets_ok(w)
  if type(w) ~= "table" then return false end
  for k, b in pairs(w) do
    if tonumber(k) == nil or type(b) ~= "table" or type(b[1]) ~= "number" or type(b[2]) ~= "number"
      or type(b[3]) ~= "number" then return false end
  end
  return true
end
local NUMBERS = {"state", "generation", "opened_at", "reopened_at", "reopens", "open_until", "forced",
  "forced_until", "blocked_until", "saturated_until", "saturated_since", "consecutive", "tumbling_failures", "tumbling_until", "last_lease",
  "last_close"}
local function readable(d)
  if type(d) ~= "table" or d.schema ~= SCHEMA then return false end
  for _, f in ipairs(NUMBERS) do
    if d[f] == nil then d[f] = 0 end
    if type(d[f]) ~= "number" then return false end
  end
  for _, f in ipairs({"reason", "slow_by"}) do
    if d[f] == nil then d[f] = "" end
    if type(d[f]) ~= "string" then return false end
  end
  for _, f in ipairs({"failure_window", "rate_window", "leases"}) do
    if d[f] == nil then d[f] = {} end
  end
  if d.seq ~= nil and type(d.seq) ~= "number" then return false end
  if d.incarnation ~= nil and type(d.incarnation) ~= "string" then return false end
  if d.state < 0 or d.state > 2 or d.generation < 1 or not buckets_ok(d.failure_window)
    or not buckets_ok(d.rate_window) then return false end
  for _, exp in pairs(d.leases) do if type(exp) ~= "number" then return false end end
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
  if ok then d = upgrade(d) end
  if ok and readable(d) then s = d else s = fresh(); rewritten = 1; created = true end
else
  s = fresh(); created = true
end
local made = created -- a fresh state (no key, or one rewritten)
if s.incarnation == nil then
  -- Written by an earlier fusebox: it gets its incarnation now.
  s.incarnation = incarnation(); created = true
end
if made and op == "rec" then
  -- The outcome being recorded was admitted under the generation the
  -- caller's view held; a state made now takes it, so that it counts
  -- (after a key vanished, the first failure must open it again).
  local g = A.gen
  if g and g >= 1 then s.generation = g end
end
local events = {}
-- The decision state's signature: when a call changes it, the view
-- sequence (v) grows and the caller publishes the snapshot to the other
-- replicas (R-ST2).
local function sig()
  return table.concat({s.state, s.generation, s.forced, s.forced_until, s.open_until, s.blocked_until, s.reason,
    s.saturated_until}, "|")
end
local before = sig()
s.seq = s.seq or 0

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
    local _, f = win_totals(s.failure_window, P.window_sec)
    return f
  end
  if s.tumbling_until ~= 0 and now >= s.tumbling_until then s.tumbling_failures = 0; s.tumbling_until = 0 end
  return s.tumbling_failures
end

local function lease_count()
  local n = 0
  for _, _ in pairs(s.leases) do n = n + 1 end
  return n
end

local function emit(from, reason)
  local c, f = win_totals(s.rate_window, P.rate_window_sec)
  local ou = 0
  if s.state == 1 then ou = s.open_until end
  table.insert(events, {from = from, to = s.state, reason = reason, failures = failures(), open_until = ou,
    forever = (s.forced == 1 and s.forced_until == 0) and 1 or 0, opened_at = s.opened_at, reopens = s.reopens,
    window_calls = c, window_failures = f, gen = s.generation, sat = 0, sat_until = 0})
end
-- emit_sat is the event of a saturation that starts (1) or ends (2): no
-- transition (from = to), machine.go's saturationEvent.
local function emit_sat(what)
  table.insert(events, {from = s.state, to = s.state, reason = "", failures = 0, open_until = 0, forever = 0,
    opened_at = 0, reopens = 0, window_calls = 0, window_failures = 0, gen = s.generation, sat = what,
    sat_until = s.saturated_until})
end

local function cooldown_for(k)
  local cd = P.cooldown_ms
  if P.backoff_multiplier > 1 then
    local i = 1
    while i < k and cd < P.max_cooldown_ms do cd = cd * P.backoff_multiplier; i = i + 1 end
    if cd > P.max_cooldown_ms then cd = P.max_cooldown_ms end
  end
  return math.floor(cd)
end

local function open(reason)
  local from = s.state
  s.state = 1; s.reason = reason; s.opened_at = now; s.reopened_at = 0; s.reopens = 0; s.closed_at = 0
  s.open_until = now + cooldown_for(1)
  s.generation = s.generation + 1
  emit(from, reason)
end

local function reopen(reason)
  local from = s.state
  s.state = 1; s.reason = reason; s.reopened_at = now; s.reopens = s.reopens + 1
  s.open_until = now + cooldown_for(s.reopens + 1)
  s.leases = {}
  s.generation = s.generation + 1
  emit(from, reason)
end

local function close(reason)
  local from = s.state
  s.state = 0; s.reason = ""; s.opened_at = 0; s.reopened_at = 0; s.reopens = 0; s.open_until = 0
  -- The close a recovery ramp is measured from (R-D8): the store holds it,
  -- so every replica ramps from the same time.
  s.closed_at = 0
  if from == 2 and reason == "probe_success" then s.closed_at = now end
  -- lc: the last close of any kind; a write-back never reopens over it
  -- with an older open (merge).
  s.last_close = now
  s.consecutive = 0; s.tumbling_failures = 0; s.tumbling_until = 0; s.failure_window = {}; s.rate_window = {}; s.leases = {}
  if from ~= 0 then
    s.generation = s.generation + 1
    emit(from, reason)
  end
end

local function advance()
  if s.forced == 1 then
    if s.forced_until ~= 0 and now >= s.forced_until then
      s.forced = 0; s.forced_until = 0
      close("force_expired")
    end
  elseif s.state == 1 and now >= s.open_until then
    s.state = 2; s.leases = {}; s.generation = s.generation + 1
    emit(1, "cooldown_elapsed")
  end
  for id, exp in pairs(s.leases) do
    if exp <= now then s.leases[id] = nil end
  end
  if s.blocked_until ~= 0 and now >= s.blocked_until then s.blocked_until = 0 end
  if s.saturated_until ~= 0 and now >= s.saturated_until then s.saturated_until = 0; emit_sat(2) end
end

local function check_rates()
  if s.state ~= 0 or (P.failure_rate_percent <= 0 and not P.tracks_slow) then return end
  local c, f, sl = win_totals(s.rate_window, P.rate_window_sec)
  if c < P.minimum_requests then return end
  if P.failure_rate_percent > 0 and f * 100 >= P.failure_rate_percent * c then
    open("failure_rate")
  elseif P.tracks_slow and sl > 0 and sl * 100 >= P.slow_call_rate_percent * c then
    local r = "slow_call_rate"
    if s.slow_by == "stall" then r = "slow_call_rate:stall" elseif s.slow_by == "baseline" then r = "slow_call_rate:baseline" end
    open(r)
  end
end

-- verdict: 0 healthy, else the recovery time (math.huge = never).
local function recovery_at()
  local rec = 0
  if s.forced == 1 then
    if s.forced_until ~= 0 then rec = s.forced_until else rec = -1 end
  elseif s.state == 1 then
    rec = s.open_until
  elseif s.state == 2 and P.half_open_max_probes > 0 and lease_count() >= P.half_open_max_probes then
    local e = 0
    for _, exp in pairs(s.leases) do if e == 0 or exp < e then e = exp end end
    rec = e
  end
  if rec ~= -1 and s.blocked_until > now and s.blocked_until > rec then rec = s.blocked_until end
  return rec
end

local res = {ok = 1, lease = 0, stale = 0, already = 0}

-- Outcomes Redis applied lately, by the caller's id: a record whose
-- answer was lost (the caller timed out after Redis ran it) is sent again
-- before the caller's resync, and must count once. A repeat changes
-- nothing and answers the transitions the first call made, so the caller
-- reports them (no transition goes unreported for a lost answer).
-- recent_ids is one string, ";<id>@<ms>" per outcome, oldest first (a
-- string costs the state's encoding a copy, where a table would cost a
-- field each); at most RECENT of them, none older than RECENT_MS.
-- recent_events keeps the transitions of the few ids that made one, in a
-- ring of their own (event_ids: the same form, at most EVENTS of them,
-- none older than RECENT_MS): ids without transitions, a busy route's
-- every outcome, never push them out. Before, they shared recent_ids:
-- 32 other records (a fraction of a second on a busy route) dropped them
-- before the caller whose answer was lost asked again after its resync,
-- and the transition went unreported (the loaded fleet soak's shared
-- chain read half_open->closed after open).
local RECENT, RECENT_MS, EVENTS = 32, 600000, 16
if type(s.recent_ids) ~= "string" then s.recent_ids = "" end
if type(s.recent_events) ~= "table" then s.recent_events = {} end
if type(s.event_ids) ~= "string" then s.event_ids = "" end
-- ring_add appends id to ring r (";<id>@<ms>" entries) and drops the
-- oldest past max entries or older than RECENT_MS.
local function ring_add(r, id, max)
  r = r .. ";" .. id .. "@" .. string.format("%d", now)
  local n = select(2, string.gsub(r, ";", ""))
  while n > max do
    r = string.sub(r, (string.find(r, ";", 2, true)) or #r + 1); n = n - 1
  end
  while true do
    local at = tonumber(string.match(r, "^;[^@]*@(%d+)"))
    if at == nil or at + RECENT_MS > now then break end
    r = string.sub(r, (string.find(r, ";", 2, true)) or #r + 1)
  end
  return r
end
-- recent_add keeps id's transitions evs and, for an idempotent call
-- (dedupe), the id itself among the applied ones.
local function recent_add(id, evs, dedupe)
  if dedupe then
    s.recent_ids = ring_add(s.recent_ids, id, RECENT)
  end
  if #evs == 0 then return end
  s.event_ids = ring_add(s.event_ids, id, EVENTS)
  s.recent_events[id] = evs
  for k, v in pairs(s.recent_events) do
    if type(v) ~= "table" or not string.find(s.event_ids, ";" .. k .. "@", 1, true) then s.recent_events[k] = nil end
  end
end

-- An operator's override (fo, fc, rst) carries an id too: one whose answer
-- was lost is sent again, in order with the outcomes recorded after it,
-- and must not apply twice (a second force-close would wipe out the
-- failures counted since the first).
local idempotent = op == "rec" or op == "fo" or op == "fc" or op == "rst"
if idempotent and A.id and string.find(s.recent_ids, ";" .. A.id .. "@", 1, true) then
  -- A repeat: applied already.
  events = s.recent_events[A.id] or {}
  op = "repeat"
end
-- A keyed record (R-DL11): KEYS[2] names the record's key (the decision
-- id and attempt number, under the breaker's hash tag). It holds the end
-- of the key's life (A.key_life ms after a record of it was applied):
-- until then whoever sends it again, on any replica and by any channel, is
-- answered already_applied and changes nothing. The slot the repeat held is freed
-- all the same (a release is idempotent).
local keyed = op == "rec" and A.rkey ~= nil and KEYS[2] ~= nil
local freed = false
local applied_until = keyed and tonumber(redis.call("GET", KEYS[2]) or "0") or 0
if keyed and applied_until > now then
  local l = tostring(A.lease or 0)
  if l ~= "0" and s.leases[l] then s.leases[l] = nil; freed = true end
  events = s.recent_events[A.id] or {}
  op = "repeat"
  res.already = 1
elseif op == "repeat" and KEYS[2] ~= nil then
  res.already = 1
end
if op == "lost" then
  -- A: call. Another call (acq, adv, snap, stl, merge) timed out on the
  -- caller after it ran here; the transitions it made are answered now,
  -- once, so the caller reports them (in the fleet soak a timed-out acq
  -- turned a route half-open and nobody logged it: the shared chain read
  -- half_open->closed after open).
  local id = "c" .. tostring(A.call)
  events = s.recent_events[id] or {}
  s.recent_events[id] = nil
  op = "repeat"
end

if op == "rec" then
  -- A: id (the caller's, for repeats), class (0 neither, 1 success, 2 failure), reason, slow, slow_by,
  --    open_now, counted (a stall already counted the call), gen (the
  --    admission's), lease (0 none), retry_after_in (ms from the event to
  --    the Retry-After's end, 0 none), route_scope (a Retry-After may
  --    block), status, block_retry_after, max_retry_after_sec,
  --    saturate_in (ms to the saturation's end, 0 none), unsaturate,
  --    decided_age (ms from the request's decision to the event, -1
  --    unknown)
  local class = A.class; local reason = A.reason; local slow = A.slow
  local open_now = A.open_now; local agen = A.gen; local lease = tostring(A.lease)
  -- Deadlines travel as durations from the event (R-H8): they become
  -- Redis's own time here, whatever the sender's clock says.
  local ra = 0
  if (A.retry_after_in or 0) > 0 then ra = now + A.retry_after_in end
  local route_scope = A.route_scope; local status = A.status
  local block = A.block_retry_after; local max_ra = A.max_retry_after_sec
  local slow_by = A.slow_by; local counted = A.counted
  if lease ~= "0" then s.leases[lease] = nil end
  advance()
  if route_scope and ra ~= 0 and block and (status == 429 or status == 503) then
    local limit = now + max_ra * 1000
    if ra > limit then ra = limit end
    if ra > s.blocked_until and ra > now then s.blocked_until = ra end
  end
  -- Quota headroom (R-H2): saturate_in when the response announced less
  -- than the route's floors, unsaturate when it announced enough; capped,
  -- extended, never shortened (machine.go saturateLocked). Enough ends it
  -- only for a request decided after the saturation began (R-H7).
  local su = 0
  if (A.saturate_in or 0) > 0 then su = now + A.saturate_in end
  local decided = -1
  if (A.decided_age or -1) >= 0 then decided = now - A.decided_age end
  if route_scope and su > now then
    local limit = now + max_ra * 1000
    if su > limit then su = limit end
    if su > s.saturated_until then
      local started = s.saturated_until <= now
      s.saturated_until = su
      if started then s.saturated_since = now; emit_sat(1) end
    end
  elseif route_scope and A.unsaturate and s.saturated_until > now and decided > (s.saturated_since or 0) then
    s.saturated_until = 0
    emit_sat(2)
  end
  if op == "rec" and agen > s.generation and s.generation == 1 and s.state == 0 and s.seq == 0 then
    -- Generations only grow: an outcome admitted under a later one than
    -- the stored state's means the state was lost and made again since
    -- (FLUSHALL; an acquire made it at generation 1 before this record
    -- came). It counts, under its own generation, as after a vanished key
    -- (#49: the first failure after a flush must open the route again).
    s.generation = agen
  end
  -- Quorum for local evidence (R-FD2): a failure Envoy originated
  -- (A.origin_local: no answer came) counts for the fleet only once
  -- P.local_origin_quorum replicas (at most A.alive, the replicas alive)
  -- each saw one of this route's in the window; below it the failure is
  -- held: it opened the sender's own view only (its egress view). local_seen
  -- keeps each replica's last local failure, pruned to the window.
  if class == 2 and A.origin_local and A.replica then
    if type(s.local_seen) ~= "table" then s.local_seen = {} end
    local span = P.window_sec * 1000
    if (s.local_seen[A.replica] or 0) < now then s.local_seen[A.replica] = now end
    local n = 0
    for r, at in pairs(s.local_seen) do
      if at + span <= now then s.local_seen[r] = nil else n = n + 1 end
    end
    local q = P.local_origin_quorum or 1
    local alive = A.alive or 1
    if alive < 1 then alive = 1 end
    if q > alive then q = alive end
    if n < q then class = 0 end
  end
  -- R-S6: an outcome from an earlier generation changes nothing. A later
  -- one (a view that ran on through an episode Redis lost or never saw,
  -- its answers lost while Redis did not answer it) is no older episode's:
  -- while the breaker is closed it is a closed route's outcome and counts
  -- (R-ST8). Before, any other generation was stale, and after FLUSHALL a
  -- failure admitted under the view's later generation opened nothing.
  -- A half-open breaker still takes only its own generation's.
  if agen < s.generation or (agen > s.generation and s.state ~= 0) then
    res.stale = 1
  elseif s.state == 0 then
    if class ~= 0 then
      local failed = class == 2
      if counted then
        win_add(s.rate_window, P.rate_window_sec, 0, failed and 1 or 0, 0)
      else
        win_add(s.rate_window, P.rate_window_sec, 1, failed and 1 or 0, slow and 1 or 0)
      end
      if slow then s.slow_by = slow_by end
      if not failed then
        s.consecutive = 0
        check_rates()
      else
        s.consecutive = s.consecutive + 1
        local count
        if P.sliding then
          win_add(s.failure_window, P.window_sec, 0, 1, 0)
          local _, f = win_totals(s.failure_window, P.window_sec)
          count = f
        else
          if s.tumbling_until ~= 0 and now >= s.tumbling_until then s.tumbling_failures = 0; s.tumbling_until = 0 end
          if s.tumbling_failures == 0 then s.tumbling_until = now + 2 * P.window_sec * 1000 end
          s.tumbling_failures = s.tumbling_failures + 1
          count = s.tumbling_failures
        end
        if open_now or count >= P.failure_threshold or (P.consecutive_failures > 0 and s.consecutive >= P.consecutive_failures) then
          open(reason)
        else
          check_rates()
        end
      end
    end
  elseif s.state == 2 then
    if class == 1 then close("probe_success") elseif class == 2 then reopen(reason) end
  end
elseif op == "acq" then
  -- A: force (try_all or the floor sends it anyway), lease_id (the
  --    caller's, random: a call that timed out on the caller but ran here
  --    is released by that id when Redis answers again)
  local force = A.force
  advance()
  if P.shadow or not P.active then
    -- admitted, no slot
  elseif s.state == 2 and s.forced == 0 and P.half_open_max_probes > 0 and s.blocked_until <= now then
    if lease_count() < P.half_open_max_probes then
      s.leases[tostring(A.lease_id)] = now + P.probe_timeout_ms
      res.lease = A.lease_id
    elseif not force then
      res.ok = 0
    end
  elseif not force then
    if recovery_at() ~= 0 then res.ok = 0 end
  end
elseif op == "stl" then
  advance()
  if P.active and s.state == 0 and P.stall_ms > 0 then
    win_add(s.rate_window, P.rate_window_sec, 1, 0, 1)
    s.slow_by = "stall"
    check_rates()
  end
elseif op == "rel" then
  -- A: lease
  s.leases[tostring(A.lease)] = nil
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
  -- A: the replica's state: forced, forced_until, opened_at, open_until,
  --    reopens, reason, blocked_in (ms left of a Retry-After block, 0
  --    none: a duration, made Redis's time here, R-H8)
  local lfo = A.forced; local lfu = A.forced_until; local loa = A.opened_at
  local lou = A.open_until; local lrc = A.reopens; local lreason = A.reason
  local lbu = 0
  if (A.blocked_in or 0) > 0 then lbu = now + A.blocked_in end
  advance()
  if lbu > s.blocked_until and lbu > now then s.blocked_until = lbu end
  local live = lfo and (lfu == 0 or lfu > now) or (not lfo and lou > now)
  if live and (s.state ~= 1 or loa > s.opened_at) and s.forced == 0 and loa > s.last_close then
    local from = s.state
    s.state = 1; s.reason = lreason; s.opened_at = loa; s.reopened_at = 0; s.reopens = lrc; s.open_until = lou
    if lfo then s.forced = 1; s.forced_until = lfu; s.open_until = lfu end
    s.leases = {}
    s.generation = s.generation + 1
    if from ~= 1 then emit(from, lreason) end
  end
elseif op == "fo" then
  -- A: duration_ms (0 = until closed)
  local d = A.duration_ms
  local from = s.state
  s.forced = 1; s.forced_until = 0
  if d > 0 then s.forced_until = now + d end
  s.state = 1; s.reason = "forced"
  if from == 0 then s.opened_at = now; s.reopened_at = 0; s.reopens = 0 end
  s.open_until = s.forced_until
  s.leases = {}
  s.generation = s.generation + 1
  if from ~= 1 then emit(from, "forced") end
elseif op == "fc" or op == "rst" then
  s.forced = 0; s.forced_until = 0
  if op == "rst" then
    -- A reset clears what the provider announced: a Retry-After block
    -- and a saturation.
    s.blocked_until = 0
    if s.saturated_until > now then s.saturated_until = 0; emit_sat(2) end
    s.saturated_until = 0
  end
  local from = s.state
  close(op == "rst" and "reset" or "force_close")
  if from == 0 then s.generation = s.generation + 1 end
end

if idempotent and A.id then recent_add(A.id, events, true) end
-- The key holds the end of its life on the script's clock (Redis's TIME);
-- Redis drops it then too.
if keyed and op == "rec" then
  redis.call("SET", KEYS[2], string.format("%d", now + A.key_life), "PX", A.key_life)
end
-- A call other than a record names itself (A.call) so that, its answer
-- lost, the caller can ask for its transitions (op lost); kept only when
-- it made one.
if A.call and #events > 0 and op ~= "repeat" then recent_add("c" .. tostring(A.call), events, false) end

local changed = 0
if sig() ~= before then
  s.seq = s.seq + 1
  changed = 1
elseif op == "repeat" and #events > 0 then
  -- The first call's change, never announced (its answer was lost): the
  -- caller announces it now.
  changed = 1
end
if (op ~= "snap" and op ~= "repeat") or changed == 1 or created or freed then
  redis.call("SET", key, cmsgpack.pack(s), "PX", P.ttl_ms)
end

local c, f, sl = win_totals(s.rate_window, P.rate_window_sec)
local earliest = 0
for _, exp in pairs(s.leases) do if earliest == 0 or exp < earliest then earliest = exp end end
-- The reply is flat (no JSON to build or parse): REPLY's fields in that
-- order, then EVENT's for each transition. script.go reads them by the
-- same names (replyNames, eventNames); TestReplyProtocolNames holds the
-- lists equal.
local REPLY = {"ok", "lease", "stale", "state", "gen", "reason", "opened_at", "reopened_at", "reopens",
  "open_until", "forced", "forced_until", "blocked_until", "consecutive", "failures", "window_calls",
  "window_failures", "window_slow", "probes", "probes_until", "seq", "changed", "rewritten", "incarnation",
  "closed_at", "saturated_until", "already", "saturated_since"}
local EVENT = {"from", "to", "reason", "failures", "open_until", "forever", "opened_at", "reopens",
  "window_calls", "window_failures", "gen", "sat", "sat_until"}
local reply = {ok = res.ok, lease = res.lease, stale = res.stale, state = s.state, gen = s.generation, reason = s.reason,
  opened_at = s.opened_at, reopened_at = s.reopened_at, reopens = s.reopens, open_until = s.open_until, forced = s.forced, forced_until = s.forced_until,
  blocked_until = s.blocked_until, consecutive = s.consecutive, failures = failures(), window_calls = c, window_failures = f,
  window_slow = sl, probes = lease_count(), probes_until = earliest, seq = s.seq, changed = changed,
  rewritten = rewritten, incarnation = s.incarnation, closed_at = s.closed_at or 0, saturated_until = s.saturated_until, already = res.already, saturated_since = s.saturated_since or 0}
local out = {}
for _, k in ipairs(REPLY) do table.insert(out, reply[k]) end
for _, e in ipairs(events) do
  for _, k in ipairs(EVENT) do table.insert(out, e[k]) end
end
return out
