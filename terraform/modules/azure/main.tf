# Azure storage for Cornus: a StorageV2 account with one private container (the azure_blob
# backend), and optionally an Azure Cache for Redis (the redis backend).

locals {
  # Storage account names: 3-24 lowercase letters and digits, globally unique.
  storage_account_name = substr("${var.name}cornus${substr(sha1(azurerm_resource_group.cornus.id), 0, 8)}", 0, 24)
  # Record blobs are named txn/<log>/<txn> inside the container (storage_adapters/azure_blob.py,
  # _record_name); data (data/) and ownership (own/) blobs must never expire.
  record_prefix = "${var.container_name}/txn/"
  # The keeps of decision tombstones, in whole days: up to a week (TOMBSTONE_KEEP_MS_MAX), one
  # lifecycle rule each.
  tombstone_keep_days_all = [1, 2, 3, 4, 5, 6, 7]
}

resource "azurerm_resource_group" "cornus" {
  name     = "${var.name}-cornus"
  location = var.location
  tags     = var.tags
}

resource "azurerm_storage_account" "cornus" {
  #checkov:skip=CKV_AZURE_206:Geo-replication is asynchronous: a failover to the secondary region can lose votes already acknowledged, and a lost VOTE_YES lets a terminator log ABORT after COMMIT was returned. ZRS (synchronous, three zones) is the default; replication_type allows GZRS for those who accept that.
  #checkov:skip=CKV2_AZURE_40:Shared key access stays on because the azure_blob backend authenticates with a connection string (storage_adapters/factory.py); it is kept in a Kubernetes Secret and the account is reachable only from allowed_subnet_ids.
  #checkov:skip=CKV2_AZURE_1:Encrypted at rest with Microsoft-managed keys; a customer-managed key needs a Key Vault and its access policies, which this module leaves to the platform team (azurerm_storage_account_customer_managed_key on this account).
  #checkov:skip=CKV2_AZURE_33:Network access is limited to allowed_subnet_ids through service endpoints (network_rules below); a private endpoint also needs a private DNS zone linked to the cluster's VNet, which belongs to the cluster's network setup.
  #checkov:skip=CKV_AZURE_33:Queue service logging: Cornus uses blobs only, this account has no queues.
  #checkov:skip=CKV_AZURE_59:Public network access is on only so that network_rules can admit the AKS subnet's service endpoint; default_action is Deny.
  name                            = local.storage_account_name
  resource_group_name             = azurerm_resource_group.cornus.name
  location                        = azurerm_resource_group.cornus.location
  account_kind                    = "StorageV2"
  account_tier                    = "Standard"
  account_replication_type        = var.replication_type
  min_tls_version                 = "TLS1_2"
  https_traffic_only_enabled      = true
  allow_nested_items_to_be_public = false
  local_user_enabled              = false
  shared_access_key_enabled       = true

  network_rules {
    default_action             = "Deny"
    bypass                     = ["AzureServices"]
    virtual_network_subnet_ids = var.allowed_subnet_ids
    ip_rules                   = var.allowed_ip_ranges
  }

  blob_properties {
    delete_retention_policy {
      days = var.soft_delete_retention_days
    }
    container_delete_retention_policy {
      days = var.soft_delete_retention_days
    }
  }

  sas_policy {
    expiration_period = "01.00:00:00"
  }

  tags = var.tags
}

resource "azurerm_storage_container" "cornus" {
  #checkov:skip=CKV2_AZURE_21:Blob read logging (Log Analytics storage insights) needs a workspace of the platform's choosing; every node's /metrics counts and times each storage call already.
  name                  = var.container_name
  storage_account_id    = azurerm_storage_account.cornus.id
  container_access_type = "private"
}

resource "azurerm_storage_management_policy" "cornus" {
  storage_account_id = azurerm_storage_account.cornus.id

  rule {
    name    = "delete-old-transaction-records"
    enabled = true
    filters {
      prefix_match = [local.record_prefix]
      blob_types   = ["blockBlob"]
    }
    actions {
      base_blob {
        delete_after_days_since_modification_greater_than = var.record_retention_days
      }
    }
  }

  # Decision tombstones: what the nodes' garbage collection leaves in a record's place (the
  # decision alone), which Azure Blob cannot expire by itself. The adapter tags each one, and only
  # those (storage_adapters/azure_blob.py, tombstone_tags): filtered on those tags, these rules can
  # never delete a record a transaction still needs. cornus-tombstone-days is the tombstone's keep
  # in whole days, rounded up, and its rule deletes it that many days after its last write: each
  # tombstone goes by the keep it was written with, whatever the nodes are set to since. Keeping
  # a tombstone again rewrites it, which restarts its days.
  dynamic "rule" {
    for_each = local.tombstone_keep_days_all
    content {
      name    = "delete-decision-tombstones-kept-${rule.value}-days"
      enabled = true
      filters {
        prefix_match = [local.record_prefix]
        blob_types   = ["blockBlob"]
        match_blob_index_tag {
          name      = "cornus-tombstone-days"
          operation = "=="
          value     = rule.value
        }
      }
      actions {
        base_blob {
          delete_after_days_since_modification_greater_than = rule.value
        }
      }
    }
  }

  # The tag every tombstone also carries, and earlier versions set alone (with no record of the
  # keep): deleted past the longest keep there is (a week), so never early.
  rule {
    name    = "delete-expired-decision-tombstones"
    enabled = true
    filters {
      prefix_match = [local.record_prefix]
      blob_types   = ["blockBlob"]
      match_blob_index_tag {
        name      = "cornus-tombstone"
        operation = "=="
        value     = "1"
      }
    }
    actions {
      base_blob {
        delete_after_days_since_modification_greater_than = 8
      }
    }
  }
}

# --- optional: Azure Cache for Redis ----------------------------------------------------------

resource "azurerm_redis_cache" "cornus" {
  #checkov:skip=CKV_AZURE_89:Public network access is off whenever the cache is injected into redis_subnet_id; without a subnet it stays reachable only over TLS with the access key.
  count                         = var.redis_enabled ? 1 : 0
  name                          = "${var.name}-cornus"
  location                      = azurerm_resource_group.cornus.location
  resource_group_name           = azurerm_resource_group.cornus.name
  sku_name                      = "Premium"
  family                        = "P"
  capacity                      = var.redis_capacity
  minimum_tls_version           = "1.2"
  non_ssl_port_enabled          = false
  public_network_access_enabled = var.redis_subnet_id == null
  subnet_id                     = var.redis_subnet_id

  # The AOF account below denies by default; its trusted-service bypass admits the cache only
  # when the cache writes with its managed identity, never with the account key.
  identity {
    type = "SystemAssigned"
  }

  redis_configuration {
    # AOF persistence to the storage account below. Azure writes the AOF once per second, not
    # per write (no appendfsync always): the nodes wait for the replica instead (the
    # redis_durability output, replicas:1; docs/deploy.md, "Durability").
    aof_backup_enabled                     = true
    aof_storage_connection_string_0        = azurerm_storage_account.aof[0].primary_blob_connection_string
    data_persistence_authentication_method = "ManagedIdentity"
    storage_account_subscription_id        = split("/", azurerm_storage_account.aof[0].id)[2]

    # Never evict: the node refuses a Redis that may (an evicted vote or decision tombstone loses
    # a transaction's outcome; Azure's default, volatile-lru, evicts tombstones first).
    maxmemory_policy = "noeviction"
  }

  tags = var.tags
}

resource "azurerm_storage_account" "aof" {
  #checkov:skip=CKV_AZURE_206:The AOF copy of a cache in the same region; geo-replication would not make the cache's own acknowledgements any more durable.
  #checkov:skip=CKV2_AZURE_40:The cache writes with its managed identity, but aof_storage_connection_string_0 is still a connection string, which the provider reads from the account's keys.
  #checkov:skip=CKV2_AZURE_1:Microsoft-managed keys, as for the main account.
  #checkov:skip=CKV2_AZURE_33:Only the Redis service writes here, with its managed identity, through the trusted-service bypass.
  #checkov:skip=CKV_AZURE_33:Queue service logging: this account holds only the cache's AOF blobs, no queues.
  #checkov:skip=CKV_AZURE_59:Public network access is on only for the trusted-service bypass; default_action is Deny.
  #checkov:skip=CKV2_AZURE_38:Soft delete would keep every rewritten AOF file; the cache owns these blobs.
  count                           = var.redis_enabled ? 1 : 0
  name                            = substr("${var.name}aof${substr(sha1(azurerm_resource_group.cornus.id), 0, 8)}", 0, 24)
  resource_group_name             = azurerm_resource_group.cornus.name
  location                        = azurerm_resource_group.cornus.location
  account_kind                    = "StorageV2"
  account_tier                    = "Standard"
  account_replication_type        = "ZRS"
  min_tls_version                 = "TLS1_2"
  https_traffic_only_enabled      = true
  allow_nested_items_to_be_public = false
  local_user_enabled              = false
  # The cache writes with its managed identity, but the provider builds
  # aof_storage_connection_string_0 from the account's keys.
  shared_access_key_enabled = true

  network_rules {
    default_action = "Deny"
    bypass         = ["AzureServices"]
  }

  sas_policy {
    expiration_period = "01.00:00:00"
  }

  tags = var.tags
}

# The cache's own identity writes its AOF (azurerm_redis_cache.cornus above).
resource "azurerm_role_assignment" "aof_writer" {
  count                = var.redis_enabled ? 1 : 0
  scope                = azurerm_storage_account.aof[0].id
  role_definition_name = "Storage Blob Data Contributor"
  principal_id         = azurerm_redis_cache.cornus[0].identity[0].principal_id
}
