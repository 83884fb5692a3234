'use strict'
// A KafkaJS consumer joins a group, subscribes to the request's topics from the beginning
// and takes whole batches until it has at least `count` records (later batches are left
// alone); then it commits the offset after the last record of each partition it took, so
// the group's offsets can be checked with other clients. read_committed unless `read_uncommitted`.
//
// Request: {brokers, deadline_ms, group_id, topics, count, read_uncommitted}
// Result:  {records: [{topic, partition, offset, key, value}], committed: [{topic,
//   partition, offset}]}

const { client, run } = require('./common')

run(async (request) => {
  const consumer = client(request, 'kafkajs-group-consumer').consumer({
    groupId: request.group_id,
    readUncommitted: Boolean(request.read_uncommitted),
    sessionTimeout: 10000,
    heartbeatInterval: 1000,
    maxWaitTimeInMs: 500,
  })
  await consumer.connect()
  const records = []
  const next = new Map() // "topic/partition": the offset after the last record taken
  let enough = false
  try {
    await consumer.subscribe({ topics: request.topics, fromBeginning: true })
    await new Promise((resolve, reject) => {
      consumer
        .run({
          autoCommit: false,
          eachBatch: async ({ batch }) => {
            if (enough) return
            for (const message of batch.messages) {
              records.push({
                topic: batch.topic,
                partition: batch.partition,
                offset: Number(message.offset),
                key: message.key === null ? null : message.key.toString('utf8'),
                value: message.value === null ? null : message.value.toString('utf8'),
              })
              next.set(`${batch.topic}/${batch.partition}`, Number(message.offset) + 1)
            }
            if (records.length >= request.count) {
              enough = true
              resolve()
            }
          },
        })
        .catch(reject)
    })
    const committed = [...next].map(([name, offset]) => {
      const slash = name.lastIndexOf('/')
      return { topic: name.slice(0, slash), partition: Number(name.slice(slash + 1)), offset }
    })
    await consumer.commitOffsets(committed.map((c) => ({ ...c, offset: String(c.offset) })))
    return { records, committed }
  } finally {
    await consumer.disconnect()
  }
})
