// A Kestrel 3.0 development config, in the shape of Kestrel's shipped config/development.scala.
import com.twitter.conversions.storage._
import com.twitter.conversions.time._
import com.twitter.logging.config._
import com.twitter.ostrich.admin.config._
import net.lag.kestrel.config._

new KestrelConfig {
  listenAddress = "0.0.0.0"
  memcacheListenPort = 22133

  queuePath = System.getenv("HOME") + "/queues"

  clientTimeout = 30.seconds

  expirationTimerFrequency = 1.second

  maxOpenTransactions = 100

  default.journalSize = 16.megabytes
  default.defaultReader.maxMemorySize = 128.megabytes

  queues = new QueueBuilder {
    name = "orders"
    defaultReader.maxAge = 3600.seconds
    defaultReader.maxItems = 2000000
  } :: new QueueBuilder {
    name = "delayed"
    defaultReader.expireToQueue = "ready"
    defaultReader.maxAge = 45.seconds
  } :: new QueueBuilder {
    name = "ready"
    syncJournal = 0.seconds
    defaultReader.puntErrorToQueue = "delayed"
    defaultReader.puntManyErrorsCount = 5
    defaultReader.puntManyErrorsToQueue = "poison"
  } :: new QueueBuilder {
    name = "bounded"
    journalSize = 1.megabyte
    defaultReader.maxSize = 64.megabytes
    defaultReader.maxMemorySize = 8.megabytes
    defaultReader.discardOldWhenFull = true
    readers = Map(
      "audit" -> new QueueReaderBuilder {
        maxItems = 1000
        discardOldWhenFull = true
      }
    )
  } :: new QueueBuilder {
    name = "scratch"
    defaultReader.maxQueueAge = 15.seconds
  }

  debugLogQueues = List()

  loggers = new LoggerConfig {
    level = Level.DEBUG
    handlers = new FileHandlerConfig {
      filename = "/var/log/kestrel/kestrel.log"
      roll = Policy.Never
    }
  }
}
