"""The Lua script behind :class:`gateway.state.redis.RedisState`: every state operation is ONE
script call (EVALSHA), so each is atomic in Redis and costs one round trip.

The script holds data operations only (``read``, ``reserve``, ``finish``, ``release``); no
routing decision is made here. Input is one JSON object in ``ARGV[1]`` (the operation, the key
prefix, the caller's clock ``now`` [s], the limits, the operation's fields); output a JSON
string. ``reserve`` is conditional: refused when a pick gained more in-flight requests since
the caller's view than the endpoint that gained the fewest, it answers a fresh view instead.
Block hashes travel as decimal strings, never Lua numbers (a 64-bit hash would lose bits).

Keys live under the prefix ``P`` (e.g. ``ridge:``), bounded by the limits it is given.
See docs/redis-state.md#the-scripts-protocol and docs/redis-state.md (key layout, bounds).
"""

from __future__ import annotations

SCRIPT = r"""
local req = cjson.decode(ARGV[1])
local P = req.p
local now = tonumber(req.now)
local L = req.lim
local MAX_PE, AGE_P, MAX_S, AGE_S, TTL, MAX_R, WIN, MAX_M =
  L[1], L[2], L[3], L[4], L[5], L[6], L[7], L[8]
local K_LRU, K_EIDS, K_EIDN = P .. 'prefix:lru', P .. 'prefix:eids', P .. 'prefix:eid_next'
local K_RES, K_RESU, K_REST = P .. 'res', P .. 'res:url', P .. 'res:tok'
local K_LR, K_LT = P .. 'load:req', P .. 'load:tok'
local K_SL, K_SU, K_SN = P .. 'sess:lru', P .. 'sess:url', P .. 'sess:seq'
local K_MODELS, K_MN = P .. 'models', P .. 'models:seq'

local function fmt(x) return string.format('%.6f', x) end
local function int(x) return string.format('%d', x) end

local function drop(rid)
  local url = redis.call('HGET', K_RESU, rid)
  if not url then return end
  local tok = tonumber(redis.call('HGET', K_REST, rid) or '0')
  redis.call('ZREM', K_RES, rid)
  redis.call('HDEL', K_RESU, rid)
  redis.call('HDEL', K_REST, rid)
  local left = redis.call('HINCRBY', K_LR, url, -1)
  if tok > 0 then redis.call('HINCRBY', K_LT, url, int(-tok)) end
  if left <= 0 then
    redis.call('HDEL', K_LR, url)
    redis.call('HDEL', K_LT, url)
  end
end

local function expire()
  for _, rid in ipairs(redis.call('ZRANGEBYSCORE', K_RES, '-inf', fmt(now))) do drop(rid) end
end

local function reserve(rid, url, tok)
  redis.call('ZADD', K_RES, fmt(now + TTL), rid)
  redis.call('HSET', K_RESU, rid, url)
  redis.call('HSET', K_REST, rid, int(tok))
  redis.call('HINCRBY', K_LR, url, 1)
  redis.call('HINCRBY', K_LT, url, int(tok))
  local over = redis.call('ZCARD', K_RES) - MAX_R
  if over > 0 then
    for _, old in ipairs(redis.call('ZRANGE', K_RES, 0, over - 1)) do drop(old) end
  end
end

local function eid_of(url, create)
  local e = redis.call('HGET', K_EIDS, url)
  if e or not create then return e end
  e = tostring(redis.call('INCR', K_EIDN))
  redis.call('HSET', K_EIDS, url, e)
  return e
end

local function leading(h, eid, cutoff)
  local lo, hi = 0, #h
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    local s = redis.call('ZSCORE', K_LRU, eid .. ':' .. h[mid])
    if s and tonumber(s) >= cutoff then lo = mid else hi = mid - 1 end
  end
  return lo
end

local function matches(h, urls)
  local out = {}
  if #h == 0 then return out end
  local cutoff = now - AGE_P
  for _, url in ipairs(urls) do
    local e = eid_of(url, false)
    if e then
      local n = leading(h, e, cutoff)
      if n > 0 then out[url] = n end
    end
  end
  return out
end

local function record(url, h)
  local e = eid_of(url, true)
  local args = {}
  for i = #h, 1, -1 do
    args[#args + 1] = fmt(now - (i - 1) * 1e-5)
    args[#args + 1] = e .. ':' .. h[i]
  end
  for s = 1, #args, 1000 do
    redis.call('ZADD', K_LRU, unpack(args, s, math.min(s + 999, #args)))
  end
  local over = redis.call('ZCARD', K_LRU) - MAX_PE
  if over > 0 then redis.call('ZREMRANGEBYRANK', K_LRU, 0, over - 1) end
  redis.call('ZREMRANGEBYSCORE', K_LRU, '-inf', '(' .. fmt(now - AGE_P))
end

local function forget(url, h, from)
  local e = eid_of(url, false)
  if not e or from >= #h then return end
  local keys = {}
  for i = from + 1, #h do keys[#keys + 1] = e .. ':' .. h[i] end
  for s = 1, #keys, 1000 do
    redis.call('ZREM', K_LRU, unpack(keys, s, math.min(s + 999, #keys)))
  end
end

local function hold(url, h, before)
  if #h == 0 then return -1 end
  record(url, h)
  return before
end

local function session_get(s)
  local v = redis.call('HGET', K_SU, s)
  if not v then return false end
  local t, url = string.match(v, '^([^|]*)|(.*)$')
  if now - tonumber(t) > AGE_S then return false end
  return url
end

local function session_drop(names)
  for _, x in ipairs(names) do
    redis.call('ZREM', K_SL, x)
    redis.call('HDEL', K_SU, x)
  end
end

local function session_bind(s, url)
  redis.call('HSET', K_SU, s, fmt(now) .. '|' .. url)
  redis.call('ZADD', K_SL, redis.call('INCR', K_SN), s)
  local over = redis.call('ZCARD', K_SL) - MAX_S
  if over > 0 then session_drop(redis.call('ZRANGE', K_SL, 0, over - 1)) end
  local oldest = redis.call('ZRANGE', K_SL, 0, 1)
  local stale = {}
  for _, x in ipairs(oldest) do
    if not session_get(x) then stale[#stale + 1] = x end
  end
  session_drop(stale)
end

local function wkeys(m)
  return P .. 'win:pm:' .. m, P .. 'win:o:' .. m, P .. 'win:sum:' .. m
end

local function push(list, sums, value, fields)
  redis.call('LPUSH', list, value)
  local parts = {}
  for x in string.gmatch(value, '%d+') do parts[#parts + 1] = x end
  for i, f in ipairs(fields) do redis.call('HINCRBY', sums, f, parts[i]) end
  while redis.call('LLEN', list) > WIN do
    local old = redis.call('RPOP', list)
    local j = 1
    for x in string.gmatch(old, '%d+') do
      if x ~= '0' then redis.call('HINCRBY', sums, fields[j], '-' .. x) end
      j = j + 1
    end
  end
end

local function observe(m, prompt, matched, output)
  local kpm, ko, ks = wkeys(m)
  push(kpm, ks, int(prompt) .. ',' .. int(matched), {'p', 'm'})
  if output >= 0 then push(ko, ks, int(output), {'o'}) end
  redis.call('ZADD', K_MODELS, redis.call('INCR', K_MN), m)
  local over = redis.call('ZCARD', K_MODELS) - MAX_M
  if over > 0 then
    for _, old in ipairs(redis.call('ZRANGE', K_MODELS, 0, over - 1)) do
      local a, b, c = wkeys(old)
      redis.call('DEL', a, b, c)
    end
    redis.call('ZREMRANGEBYRANK', K_MODELS, 0, over - 1)
  end
end

local function window(m)
  local _, ko, ks = wkeys(m)
  local s = redis.call('HMGET', ks, 'p', 'm', 'o')
  return {tonumber(s[1] or '0'), tonumber(s[2] or '0'), tonumber(s[3] or '0'),
          redis.call('LLEN', ko)}
end

local function loads(urls)
  local out = {}
  if #urls == 0 then return out end
  local r = redis.call('HMGET', K_LR, unpack(urls))
  local t = redis.call('HMGET', K_LT, unpack(urls))
  for i, url in ipairs(urls) do
    if r[i] then out[url] = {tonumber(r[i]), tonumber(t[i] or '0')} end
  end
  return out
end

local function view()
  local v = {ok = false, m = matches(req.h, req.urls), l = loads(req.urls), w = window(req.model),
             s = false}
  if req.session ~= '' then v.s = session_get(req.session) end
  return v
end

local function gained(url, seen)
  return tonumber(redis.call('HGET', K_LR, url) or '0') - seen
end

local function taken()
  local least = math.huge
  for i, url in ipairs(req.urls) do least = math.min(least, gained(url, req.seen[i])) end
  for i, url in ipairs(req.picks) do
    if gained(url, req.expect[i]) > math.max(least, 0) then return true end
  end
  return false
end

expire()
if req.op == 'read' then
  return cjson.encode(view())
elseif req.op == 'reserve' then
  if not req.force and taken() then return cjson.encode(view()) end
  local froms = {}
  for i, url in ipairs(req.picks) do
    local before = matches(req.h, {url})[url] or 0
    reserve(req.rids[i], url, req.tok)
    froms[i] = hold(url, req.h, before)
  end
  return cjson.encode({ok = true, from = froms})
elseif req.op == 'finish' then
  for _, rid in ipairs(req.rids) do drop(rid) end
  if req.ok then
    if #req.h > 0 then record(req.url, req.h) end
    if req.session ~= '' then session_bind(req.session, req.url) end
    observe(req.model, req.pt, req.mt, req.o)
  elseif req.ff >= 0 then
    forget(req.url, req.h, req.ff)
  end
elseif req.op == 'release' then
  for _, rid in ipairs(req.rids) do drop(rid) end
end
return '{}'
"""
