output "resource_group_name" {
  description = "The resource group holding Cornus's storage."
  value       = azurerm_resource_group.cornus.name
}

output "storage_account_name" {
  description = "The storage account of the azure_blob backend."
  value       = azurerm_storage_account.cornus.name
}

output "container_name" {
  description = "The container: the chart's storage.azureBlob.container."
  value       = azurerm_storage_container.cornus.name
}

output "storage_connection_string" {
  description = "The account's connection string, for the Kubernetes Secret that the chart's storage.azureBlob.existingSecret names (key connection-string)."
  value       = azurerm_storage_account.cornus.primary_connection_string
  sensitive   = true
}

output "storage_secondary_connection_string" {
  description = "The connection string of the account's other key: rotate through it (docs/deploy.md, section 3), never by renewing the key the nodes use."
  value       = azurerm_storage_account.cornus.secondary_connection_string
  sensitive   = true
}

output "redis_durability" {
  description = "storage.redis.durability for the Azure Cache: its replica (a Premium cache has one) must have each write before the node answers it (the AOF is written once per second, replication is asynchronous; docs/deploy.md, \"Durability\"); null without redis_enabled."
  value       = var.redis_enabled ? "replicas:1" : null
}

output "redis_url" {
  description = "rediss:// URL of the Azure Cache for Redis, password included (for the Secret of storage.redis.existingSecret); null without redis_enabled."
  value       = var.redis_enabled ? "rediss://:${azurerm_redis_cache.cornus[0].primary_access_key}@${azurerm_redis_cache.cornus[0].hostname}:${azurerm_redis_cache.cornus[0].ssl_port}/0" : null
  sensitive   = true
}

output "helm_values" {
  description = "Chart values for the azure_blob backend (add storage.azureBlob.existingSecret, the Secret holding storage_connection_string)."
  value = {
    storage = {
      backend = "azure_blob"
      # Azure Blob answers in ~10 ms where Redis answers in ~1, and its slow calls are slower
      # still: a longer deadline per storage call, as in helm/cornus/ci/azure-blob-values.yaml.
      timeoutMsCall = 8000
      azureBlob = {
        container = azurerm_storage_container.cornus.name
      }
    }
    timeouts = {
      # At least 2 * timeoutMsCall + clock_slack_ms (1000 by default), or the chart refuses it;
      # minutes, since Azure cannot refuse a write that arrives late (docs/deploy.md section 5).
      gc_grace_ms = 300000
      # No stop outlasts that grace: a stopping node leaves its last transactions' records
      # uncollected rather than wait in vain (the chart refuses a shorter wait other than 0).
      timeout_ms_stop_collect = 0
    }
    devRedis = {
      enabled = false
    }
  }
}
