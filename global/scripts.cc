#include "global/scripts.h"

namespace tailcut::detail {

std::vector<std::string> JobKeys(const std::string& job_name) {
  const std::string prefix = "tailcut:{" + job_name + "}:";
  return {prefix + "config",   prefix + "cursor", prefix + "done",
          prefix + "deadline", prefix + "owner",  prefix + "gen",
          prefix + "left",     prefix + "hosts",  prefix + "lost"};
}

// Shared by the scripts: Redis server time in ms (one clock for all hosts),
// integers as decimal strings (Lua 5.1 prints large numbers as 1e+15), and
// job(run): the job's configuration, or nil and what of it is lost. `run` is
// the run id the caller joined ('*': any run, for tools). The config hash
// gone means the whole job is gone (Redis restarted without persistence, or
// the keys were deleted): job() then leaves a `lost` mark with that run id,
// so that a host opening the job later is refused too instead of starting it
// over (see kCreateScript). Every script that serves a joined host calls it
// first, so the check and the operation are one atomic step.
#define TAILCUT_LUA_PRELUDE                                                               \
  "local function now_ms()\n"                                                             \
  "  local t = redis.call('TIME')\n"                                                      \
  "  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"                  \
  "end\n"                                                                                 \
  "local function s(x) return string.format('%d', x) end\n"                               \
  "local function job(run)\n"                                                             \
  "  local c = redis.call('HMGET', KEYS[1], 'items', 'epochs', 'block', 'done', 'run')\n" \
  "  if not c[1] then\n"                                                                  \
  "    if run and run ~= '*' then redis.call('SET', KEYS[9], run) end\n"                  \
  "    return nil, 'gone'\n"                                                              \
  "  end\n"                                                                               \
  "  if run and run ~= '*' and (c[5] or '') ~= run then return nil, 'replaced' end\n"     \
  "  local j = {items = tonumber(c[1]), epochs = tonumber(c[2]),\n"                       \
  "             block = tonumber(c[3]), done = tonumber(c[4])}\n"                         \
  "  j.total = j.items * j.epochs\n"                                                      \
  "  if redis.call('EXISTS', KEYS[2]) == 0 then return nil, 'cursor' end\n"               \
  "  if j.done > 0 and redis.call('EXISTS', KEYS[3]) == 0 then return nil, 'done' end\n"  \
  "  return j\n"                                                                          \
  "end\n"                                                                                 \
  "local function count(host, what, n)\n"                                                 \
  "  redis.call('HINCRBY', KEYS[8], what .. ':' .. host, n)\n"                            \
  "end\n"

// Creates the job (from a saved state if given) or checks that the existing
// one has the same configuration; ARGV[6] '0': the seed is not the caller's
// choice, so a job that exists keeps its own; ARGV[7]: a fresh run id, the
// job's if this call creates it. Returns {'created', seed, run},
// {'joined', seed, run}, {'mismatch', field, existing value}, or {'lost'}: the
// job was lost while hosts ran it (job() left its mark) and no state is given
// to restart it from. Restoring (ARGV[8] cursor, ARGV[9] bitmap): every block
// below the cursor with tickets not done goes into the deadline set already
// expired, with no holder and generation 0, so the next Claim re-owns it and
// hands out those tickets. ARGV[10], with a state: the restore's token. The
// hosts of one restore pass the same: the first replaces a job of another
// token (an earlier run's, which went on past the state), the others join.
const Script kCreateScript = {"create", TAILCUT_LUA_PRELUDE R"lua(
local fields = {'items', 'epochs', 'block', 'seed', 'files', 'run'}
local token = ARGV[10] or ''
if token ~= '' and redis.call('EXISTS', KEYS[1]) == 1 and
   redis.call('HGET', KEYS[1], 'restore') ~= token then
  redis.call('DEL', KEYS[1])
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  local have = redis.call('HMGET', KEYS[1], unpack(fields))
  for i = 1, 5 do
    local f = fields[i]
    if have[i] ~= ARGV[i] and not (f == 'seed' and ARGV[6] == '0') then
      return {'mismatch', f, have[i] or ''}
    end
  end
  return {'joined', have[4], have[6] or ''}
end
if ARGV[8] == nil and redis.call('EXISTS', KEYS[9]) == 1 then return {'lost'} end
-- A new run: whatever an earlier run left (a partly deleted job) goes.
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
redis.call('HSET', KEYS[1], 'items', ARGV[1], 'epochs', ARGV[2], 'block', ARGV[3],
           'seed', ARGV[4], 'files', ARGV[5], 'done', 0, 'run', ARGV[7], 'restore', token)
if ARGV[8] == nil then
  redis.call('SET', KEYS[2], 0)
  return {'created', ARGV[4], ARGV[7]}
end
local cursor = tonumber(ARGV[8])
redis.call('SET', KEYS[2], ARGV[8])
if #ARGV[9] > 0 then redis.call('SET', KEYS[3], ARGV[9]) end
local j = job()
local done = redis.call('BITCOUNT', KEYS[3])
redis.call('HSET', KEYS[1], 'done', done)
local reopened = 0
for first = 0, math.min(cursor, j.total) - 1, j.block do
  local last = math.min(first + j.block, j.total)
  local n = redis.call('BITCOUNT', KEYS[3], first, last - 1, 'BIT')
  if n < last - first then
    redis.call('ZADD', KEYS[4], 0, s(first))
    redis.call('HSET', KEYS[5], s(first), '')
    redis.call('HSET', KEYS[6], s(first), 0)
    redis.call('HSET', KEYS[7], s(first), last - first - n)
    reopened = reopened + 1
  end
end
return {'created', ARGV[4], ARGV[7], done, reopened}
)lua"};

// Claim(run, host, ttl[, 'expired']): re-own the expired block with the
// earliest deadline (generation + 1, only its tickets without done marks),
// else take the next block from the cursor; with 'expired', only the first
// (a host with work enough that looks for a dead host's blocks), else
// {'wait', ms until the soonest deadline}. Returns
// {'reclaimed', first, last, gen, {tickets}},
// {'new', first, last, gen}, {'wait', ms until the soonest deadline}, {'end'}
// or {'lost', what}: what job() says, 'gen' (an open block without a
// generation: re-owning it would hand out generation 1 again and void the
// fencing), or 'blocks' (the cursor is past the end, no block is open, and
// yet tickets are not done: the open blocks are gone).
const Script kClaimScript = {"claim", TAILCUT_LUA_PRELUDE R"lua(
local j, lost = job(ARGV[1])
if not j then return {'lost', lost} end
local host, ttl = ARGV[2], tonumber(ARGV[3])
local now = now_ms()
while true do
  local expired = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 1)
  if #expired == 0 then break end
  local first = tonumber(expired[1])
  local last = math.min(first + j.block, j.total)
  local tickets = {}
  for t = first, last - 1 do
    if redis.call('GETBIT', KEYS[3], t) == 0 then tickets[#tickets + 1] = t end
  end
  if #tickets == 0 then
    redis.call('ZREM', KEYS[4], expired[1])
    redis.call('HDEL', KEYS[5], expired[1])
    redis.call('HDEL', KEYS[7], expired[1])
  else
    if not redis.call('HGET', KEYS[6], expired[1]) then return {'lost', 'gen'} end
    local gen = redis.call('HINCRBY', KEYS[6], expired[1], 1)
    redis.call('HSET', KEYS[5], expired[1], host)
    redis.call('HSET', KEYS[7], expired[1], #tickets)
    redis.call('ZADD', KEYS[4], now + ttl, expired[1])
    count(host, 'claims', 1)
    count(host, 'reclaims', 1)
    return {'reclaimed', first, last, gen, tickets}
  end
end
if ARGV[4] == 'expired' then
  local soonest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  if #soonest == 0 then return {'wait', 1000} end
  return {'wait', math.max(0, tonumber(soonest[2]) - now)}
end
local cursor = tonumber(redis.call('GET', KEYS[2]))
if cursor < j.total then
  local next = redis.call('INCRBY', KEYS[2], j.block)
  local first = next - j.block
  local last = math.min(next, j.total)
  local gen = redis.call('HINCRBY', KEYS[6], s(first), 1)
  redis.call('HSET', KEYS[5], s(first), host)
  redis.call('HSET', KEYS[7], s(first), last - first)
  redis.call('ZADD', KEYS[4], now + ttl, s(first))
  count(host, 'claims', 1)
  return {'new', first, last, gen}
end
local soonest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if #soonest > 0 then return {'wait', math.max(0, tonumber(soonest[2]) - now)} end
if j.done == j.total then return {'end'} end
return {'lost', 'blocks'}
)lua"};

// Renew(run, host, first, gen, ttl): {'ok'}, {'closed'} (all done), {'stale'}
// (re-owned; counted) or {'lost', what}: what job() says, or 'gen' (the
// block's generation is gone: it was set when the block was claimed and is
// never removed).
const Script kRenewScript = {"renew", TAILCUT_LUA_PRELUDE R"lua(
local j, lost = job(ARGV[1])
if not j then return {'lost', lost} end
local host, first = ARGV[2], ARGV[3]
local gen = redis.call('HGET', KEYS[6], first)
if not gen then return {'lost', 'gen'} end
if gen ~= ARGV[4] then
  count(host, 'stale_renews', 1)
  return {'stale'}
end
if not redis.call('ZSCORE', KEYS[4], first) then return {'closed'} end
if redis.call('HGET', KEYS[5], first) ~= host then
  count(host, 'stale_renews', 1)
  return {'stale'}
end
redis.call('ZADD', KEYS[4], now_ms() + tonumber(ARGV[5]), first)
return {'ok'}
)lua"};

// Ack(run, host, first, gen, tickets...): {'ok', newly}, {'closed', newly}
// (the block's last ticket got done), {'stale'} (counted), {'invalid'} or
// {'lost', what} as Renew.
const Script kAckScript = {"ack", TAILCUT_LUA_PRELUDE R"lua(
local j, lost = job(ARGV[1])
if not j then return {'lost', lost} end
local host, first_key = ARGV[2], ARGV[3]
local gen = redis.call('HGET', KEYS[6], first_key)
if not gen then return {'lost', 'gen'} end
if gen ~= ARGV[4] then
  count(host, 'stale_acks', 1)
  return {'stale'}
end
local first = tonumber(first_key)
local last = math.min(first + j.block, j.total)
for i = 5, #ARGV do
  local t = tonumber(ARGV[i])
  if not t or t < first or t >= last then return {'invalid'} end
end
local newly = 0
for i = 5, #ARGV do
  if redis.call('SETBIT', KEYS[3], ARGV[i], 1) == 0 then newly = newly + 1 end
end
if newly == 0 then return {'ok', 0} end
redis.call('HINCRBY', KEYS[1], 'done', newly)
count(host, 'acked', newly)
if redis.call('HINCRBY', KEYS[7], first_key, -newly) <= 0 then
  redis.call('ZREM', KEYS[4], first_key)
  redis.call('HDEL', KEYS[5], first_key)
  redis.call('HDEL', KEYS[7], first_key)
  return {'closed', newly}
end
return {'ok', newly}
)lua"};

// Stats(run): {items, epochs, block, done, cursor, {first, host, gen,
// deadline-now, left}..., {field, value}...} read in one step, or
// {'lost', what}.
const Script kStatsScript = {"stats", TAILCUT_LUA_PRELUDE R"lua(
local j, lost = job(ARGV[1])
if not j then return {'lost', lost} end
local now = now_ms()
local open = {}
local blocks = redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')
for i = 1, #blocks, 2 do
  local first = blocks[i]
  open[#open + 1] = {tonumber(first), redis.call('HGET', KEYS[5], first) or '',
                     tonumber(redis.call('HGET', KEYS[6], first) or '0'),
                     tonumber(blocks[i + 1]) - now,
                     tonumber(redis.call('HGET', KEYS[7], first) or '0')}
end
return {j.items, j.epochs, j.block, j.done, tonumber(redis.call('GET', KEYS[2])), open,
        redis.call('HGETALL', KEYS[8])}
)lua"};

// Save(run): {cursor, done bitmap} read in one step, or {'lost', what}.
const Script kSaveScript = {"save", TAILCUT_LUA_PRELUDE R"lua(
local j, lost = job(ARGV[1])
if not j then return {'lost', lost} end
return {redis.call('GET', KEYS[2]), redis.call('GET', KEYS[3]) or ''}
)lua"};

}  // namespace tailcut::detail
