// A Kestrel 2.4 development config, in the shape of Kestrel's shipped config/development.scala.
import com.twitter.conversions.storage._
import com.twitter.conversions.time._
import com.twitter.logging.config._
import com.twitter.ostrich.admin.config._
import net.lag.kestrel.config._

new KestrelConfig {
  listenAddress = "127.0.0.1"
  memcacheListenPort = 22133

  queuePath = "/tmp/kestrel-dev"

  clientTimeout = 30.seconds

  expirationTimerFrequency = 1.second

  maxOpenTransactions = 100

  default.defaultJournalSize = 16.megabytes
  default.maxMemorySize = 128.megabytes
  default.maxJournalSize = 1.gigabyte

  queues = new QueueBuilder {
    name = "orders"
    maxAge = 3600.seconds
    maxItems = 2000000
  } :: new QueueBuilder {
    name = "delayed"
    expireToQueue = "ready"
    maxAge = 45.seconds
  } :: new QueueBuilder {
    name = "ready"
    syncJournal = 0.seconds
  } :: new QueueBuilder {
    name = "mail"
  } :: new QueueBuilder {
    name = "mail_backup"
  } :: new QueueBuilder {
    name = "events"
    fanoutOnly = true
  } :: new QueueBuilder {
    name = "bounded"
    maxSize = 64.megabytes
    maxMemorySize = 8.megabytes
    maxJournalSize = 64.megabytes
    discardOldWhenFull = true
  } :: new QueueBuilder {
    name = "careful"
    syncJournal = 20.milliseconds
    openTransactionTimeout = 2.minutes
  }

  aliases = new AliasBuilder {
    name = "order_alias"
    destinationQueues = List("orders")
  } :: new AliasBuilder {
    name = "mail_all"
    destinationQueues = List("mail", "mail_backup")
  }
}
