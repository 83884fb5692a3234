'use strict'
// A KafkaJS transactional producer (idempotent, one request in flight) runs the request's
// transactions in order, each spanning the partitions its messages name, and ends each
// with a commit or an abort. Prints, per transaction, the base offset every partition's
// batch got.
//
// Request: {brokers, deadline_ms, transactional_id, transactions: [{end: "commit" | "abort",
//   messages: [{topic, partition, key, value}]}]}
// Result:  {transactions: [{end, sent: [{topic, partition, base_offset}]}]}

const { Partitioners } = require('kafkajs')
const { client, run } = require('./common')

run(async (request) => {
  const producer = client(request, 'kafkajs-txn-producer').producer({
    transactionalId: request.transactional_id,
    idempotent: true,
    maxInFlightRequests: 1,
    createPartitioner: Partitioners.DefaultPartitioner,
    retry: { initialRetryTime: 100, maxRetryTime: 2000, retries: Number.MAX_SAFE_INTEGER },
  })
  await producer.connect()
  const done = []
  try {
    for (const transaction of request.transactions) {
      const txn = await producer.transaction()
      const byTopic = new Map()
      for (const { topic, partition, key, value } of transaction.messages) {
        if (!byTopic.has(topic)) byTopic.set(topic, [])
        byTopic.get(topic).push({ partition, key, value })
      }
      const sent = await txn.sendBatch({
        acks: -1,
        topicMessages: [...byTopic].map(([topic, messages]) => ({ topic, messages })),
      })
      if (transaction.end === 'commit') await txn.commit()
      else await txn.abort()
      done.push({
        end: transaction.end,
        sent: sent.map((r) => ({
          topic: r.topicName,
          partition: r.partition,
          base_offset: Number(r.baseOffset),
        })),
      })
    }
  } finally {
    await producer.disconnect()
  }
  return { transactions: done }
})
