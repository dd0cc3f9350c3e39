-- Many streams' partition counts in one call, sent by unilog/engine/partitions.py (Partitions.partitions_many, on a
-- single Redis: a cluster's streams live in different slots). KEYS: the streams' meta hashes. Reply: each one's
-- 'partitions' field, in order (nil where it is not set: the stream is not partitioned).
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('HGET', key, 'partitions')
end
return out
