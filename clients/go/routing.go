package keylane

// Murmur2 is Kafka's murmur2 (seed 0x9747b28c), byte-identical to
// org.apache.kafka.common.utils.Utils.murmur2, librdkafka's rd_murmur2 and
// keylane's kl_murmur2(): if it were not, a key published from Go and the
// same key published from C would land on two partitions, and two workers
// would write one entity.
func Murmur2(key []byte) uint32 {
	const m = 0x5bd1e995
	n := len(key)
	h := uint32(0x9747b28c) ^ uint32(n)
	i := 0
	for ; i+4 <= n; i += 4 {
		k := uint32(key[i]) | uint32(key[i+1])<<8 | uint32(key[i+2])<<16 | uint32(key[i+3])<<24
		k *= m
		k ^= k >> 24
		k *= m
		h *= m
		h ^= k
	}
	switch n - i {
	case 3:
		h ^= uint32(key[i+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(key[i+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(key[i])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// Partition is the partition keylane, `keylane route` and the Java
// client's default partitioner pick for key: (murmur2(key) & 0x7fffffff)
// % partitions; -1 when partitions < 1.
func Partition(key []byte, partitions int32) int32 {
	if partitions < 1 {
		return -1
	}
	return int32((Murmur2(key) & 0x7fffffff) % uint32(partitions))
}
