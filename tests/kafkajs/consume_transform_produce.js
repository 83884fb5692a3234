'use strict'
// Consume-transform-produce with KafkaJS: a group consumer reads the source topic
// (read_committed), and for every batch a transactional producer writes each record,
// transformed to "out(value)", to the same partition of the sink topic and puts the
// offset after the batch into the transaction (sendOffsets: AddOffsetsToTxn,
// TxnOffsetCommit). The first batch goes first in a transaction that is aborted (its
// records written as "aborted(value)"); the group's offsets are read back once the retry's
// records are sent, when the abort is complete (a transaction starts only after the
// previous one ended), and before the retry sends its own offsets. Stops after `count`
// source records.
//
// Request: {brokers, deadline_ms, group_id, transactional_id, source, sink, count}
// Result:  {consumed: [{partition, offset, value}], aborted_values: [the first batch's
//   values], offsets_after_abort: [{partition, offset}], aborted: n, committed: n}

const { Partitioners } = require('kafkajs')
const { client, run } = require('./common')

run(async (request) => {
  const kafka = client(request, 'kafkajs-transformer')
  const consumer = kafka.consumer({
    groupId: request.group_id,
    sessionTimeout: 10000,
    heartbeatInterval: 1000,
    maxWaitTimeInMs: 500,
  })
  const producer = kafka.producer({
    transactionalId: request.transactional_id,
    idempotent: true,
    maxInFlightRequests: 1,
    createPartitioner: Partitioners.DefaultPartitioner,
    retry: { initialRetryTime: 100, maxRetryTime: 2000, retries: Number.MAX_SAFE_INTEGER },
  })
  const admin = kafka.admin()
  await Promise.all([consumer.connect(), producer.connect(), admin.connect()])
  const result = {
    consumed: [],
    aborted_values: [],
    offsets_after_abort: null,
    aborted: 0,
    committed: 0,
  }

  // One transaction over the batch: its records transformed with `label`, then its
  // offsets, ended by `end` ("commit" or "abort"); `beforeOffsets` runs in between.
  async function transform(batch, label, end, beforeOffsets) {
    const txn = await producer.transaction()
    await txn.send({
      topic: request.sink,
      acks: -1,
      messages: batch.messages.map((m) => ({
        partition: batch.partition,
        key: m.key,
        value: `${label}(${m.value.toString('utf8')})`,
      })),
    })
    if (beforeOffsets) await beforeOffsets()
    const after = Number(batch.messages[batch.messages.length - 1].offset) + 1
    await txn.sendOffsets({
      consumerGroupId: request.group_id,
      topics: [
        { topic: batch.topic, partitions: [{ partition: batch.partition, offset: String(after) }] },
      ],
    })
    if (end === 'commit') await txn.commit()
    else await txn.abort()
    result[end === 'commit' ? 'committed' : 'aborted'] += 1
  }

  async function readGroupOffsets() {
    const [found] = await admin.fetchOffsets({
      groupId: request.group_id,
      topics: [request.source],
    })
    result.offsets_after_abort = found.partitions.map((p) => ({
      partition: p.partition,
      offset: Number(p.offset),
    }))
  }

  try {
    await consumer.subscribe({ topics: [request.source], fromBeginning: true })
    await new Promise((resolve, reject) => {
      consumer
        .run({
          autoCommit: false,
          eachBatchAutoResolve: false,
          eachBatch: async ({ batch, resolveOffset, heartbeat }) => {
            if (batch.isEmpty()) return
            let check = null
            if (result.aborted === 0) {
              await transform(batch, 'aborted', 'abort', null)
              result.aborted_values = batch.messages.map((m) => m.value.toString('utf8'))
              check = readGroupOffsets
            }
            await transform(batch, 'out', 'commit', check)
            for (const message of batch.messages) {
              const value = message.value.toString('utf8')
              const offset = Number(message.offset)
              result.consumed.push({ partition: batch.partition, offset, value })
              resolveOffset(message.offset)
            }
            await heartbeat()
            if (result.consumed.length >= request.count) resolve()
          },
        })
        .catch(reject)
    })
    return result
  } finally {
    await Promise.all([consumer.disconnect(), producer.disconnect(), admin.disconnect()])
  }
})
