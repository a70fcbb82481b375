// A Kestrel 3.0 production config, in the shape of Kestrel's shipped config/production.scala.
import com.twitter.conversions.storage._
import com.twitter.conversions.time._
import com.twitter.logging.config._
import com.twitter.ostrich.admin.config._
import net.lag.kestrel.config._

new KestrelConfig {
  listenAddress = "0.0.0.0"
  memcacheListenPort = 22133
  textListenPort = 2222
  thriftListenPort = 2229

  queuePath = "/srv/kestrel/queues"

  clientTimeout = None

  expirationTimerFrequency = 1.second

  maxOpenTransactions = 100

  default.journalSize = 16.megabytes
  default.syncJournal = 100.milliseconds
  default.defaultReader.maxMemorySize = 128.megabytes

  admin.httpPort = 2223

  admin.statsNodes = new StatsConfig {
    reporters = new TimeSeriesCollectorConfig
  }

  queues = new QueueBuilder {
    name = "orders"
    defaultReader.maxItems = 2000000
    defaultReader.maxAge = 3600.seconds
  } :: new QueueBuilder {
    name = "clicks"
    journaled = false
  }

  loggers = new LoggerConfig {
    level = Level.INFO
    handlers = new FileHandlerConfig {
      filename = "/var/log/kestrel/kestrel.log"
      roll = Policy.SigHup
    }
  }
}
