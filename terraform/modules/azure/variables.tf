variable "name" {
  description = "Prefix of every resource name (letters and digits; the storage account name is derived from it and must be globally unique)."
  type        = string
  validation {
    condition     = can(regex("^[a-z][a-z0-9]{2,15}$", var.name))
    error_message = "name must be 3-16 lowercase letters and digits, starting with a letter (storage account names allow nothing else)."
  }
}

variable "location" {
  description = "Azure region, e.g. westeurope."
  type        = string
}

variable "container_name" {
  description = "Blob container for Cornus's records, data and ownership blobs (the chart's storage.azureBlob.container)."
  type        = string
  default     = "cornus"
}

variable "replication_type" {
  description = "Storage account replication. LRS or ZRS: both acknowledge a write only once it is durable in the region. Geo-replication (GRS, GZRS) copies to the secondary region asynchronously, so a failover to it can lose acknowledged votes; see docs/deploy.md."
  type        = string
  default     = "ZRS"
  validation {
    condition     = contains(["LRS", "ZRS", "GRS", "GZRS", "RAGRS", "RAGZRS"], var.replication_type)
    error_message = "replication_type must be one of LRS, ZRS, GRS, GZRS, RAGRS, RAGZRS."
  }
}

variable "allowed_subnet_ids" {
  description = "Subnets (with the Microsoft.Storage service endpoint) allowed to reach the storage account, e.g. the AKS node subnet. Every other network is denied."
  type        = list(string)
}

variable "allowed_ip_ranges" {
  description = "Public IP ranges (CIDR) also allowed to reach the storage account, e.g. where Terraform runs; empty for none."
  type        = list(string)
  default     = []
}

variable "record_retention_days" {
  description = "The GC horizon: transaction records (blobs under <container>/txn/) unchanged for this many days are deleted by a lifecycle rule. Nodes delete decided records themselves; this sweeps what they left behind. It must exceed the longest time a transaction could stay undecided or unapplied (a storage outage you would ride out), because deleting such a record is what Cornus's GC must never do."
  type        = number
  default     = 30
  validation {
    condition     = var.record_retention_days >= 7
    error_message = "record_retention_days must be at least 7: a shorter horizon could delete the record of a transaction still waiting out a storage outage."
  }
}

variable "soft_delete_retention_days" {
  description = "Days a deleted blob or container can be restored (soft delete), against a mistaken deletion of data."
  type        = number
  default     = 7
}

variable "redis_enabled" {
  description = "Also create an Azure Cache for Redis (Premium, AOF persistence, TLS only) for the redis backend."
  type        = bool
  default     = false
}

variable "redis_capacity" {
  description = "Premium cache size: 1 (P1, 6 GB) to 5 (P5, 120 GB)."
  type        = number
  default     = 1
}

variable "redis_subnet_id" {
  description = "Subnet to inject the cache into (Premium VNet injection), so only that network reaches it; null leaves it on its public endpoint (public network access on, TLS only; reach it only with its access key from a Secret)."
  type        = string
  default     = null
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
