'use strict'
// What every KafkaJS program of the e2e tests shares: the request comes as JSON on stdin,
// the result goes as one JSON line to stdout (the only thing written there: KafkaJS logs
// go to stderr), and a program still running past its deadline exits with status 2.

const { Kafka, logLevel } = require('kafkajs')

const LEVELS = {
  [logLevel.ERROR]: 'ERROR',
  [logLevel.WARN]: 'WARN',
  [logLevel.INFO]: 'INFO',
  [logLevel.DEBUG]: 'DEBUG',
}

function toStderr() {
  return ({ namespace, level, log }) => {
    const { message, timestamp, ...rest } = log
    const fields = JSON.stringify(rest)
    process.stderr.write(`${timestamp} ${LEVELS[level]} [${namespace}] ${message} ${fields}\n`)
  }
}

function readRequest() {
  return new Promise((resolve, reject) => {
    const chunks = []
    process.stdin.on('data', (chunk) => chunks.push(chunk))
    process.stdin.on('end', () => {
      try {
        resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')))
      } catch (error) {
        reject(error)
      }
    })
    process.stdin.on('error', reject)
  })
}

// A client of the request's brokers, retrying soon (a test cluster answers in
// milliseconds or is restarting); the program's deadline bounds the whole run.
function client(request, clientId) {
  return new Kafka({
    clientId,
    brokers: request.brokers,
    logLevel: logLevel.WARN,
    logCreator: toStderr,
    connectionTimeout: 5000,
    requestTimeout: 30000,
    retry: { initialRetryTime: 100, maxRetryTime: 2000, retries: 15 },
  })
}

// Runs `main(request)` and prints what it returns; any failure, or the request's
// `deadline_ms` passing first, ends the process with a non-zero status.
function run(main) {
  readRequest()
    .then((request) => {
      const timer = setTimeout(() => {
        process.stderr.write(`deadline of ${request.deadline_ms} ms passed\n`)
        process.exit(2)
      }, request.deadline_ms)
      return main(request).then((result) => {
        clearTimeout(timer)
        process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0))
      })
    })
    .catch((error) => {
      process.stderr.write(`failed: ${error && error.stack ? error.stack : error}\n`)
      process.exit(1)
    })
}

module.exports = { client, run }
