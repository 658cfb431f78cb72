variable "name" {
  description = "Prefix of every resource name."
  type        = string
}

variable "table_name" {
  description = "The DynamoDB table (the chart's storage.dynamodb.table)."
  type        = string
  default     = "cornus"
}

variable "kms_key_arn" {
  description = "A customer-managed KMS key for the table's encryption at rest; null uses the AWS-managed key (alias/aws/dynamodb). With a key of yours, its key policy must let the role below use it through DynamoDB."
  type        = string
  default     = null
}

variable "oidc_provider_arn" {
  description = "ARN of the EKS cluster's IAM OIDC provider (IRSA), e.g. arn:aws:iam::123456789012:oidc-provider/oidc.eks.eu-west-1.amazonaws.com/id/EXAMPLE."
  type        = string
}

variable "oidc_issuer" {
  description = "The cluster's OIDC issuer without https://, e.g. oidc.eks.eu-west-1.amazonaws.com/id/EXAMPLE."
  type        = string
}

variable "namespace" {
  description = "Kubernetes namespace of the Helm release."
  type        = string
}

variable "service_account_name" {
  description = "The chart's ServiceAccount (the release's fullname unless serviceAccount.name is set)."
  type        = string
}

variable "elasticache_enabled" {
  description = "Also create an ElastiCache Redis replication group (TLS, AUTH token, Multi-AZ) for the redis backend. Its replication is asynchronous: set the chart's storage.redis.durability to the redis_durability output (docs/deploy.md, \"Durability\")."
  type        = bool
  default     = false
}

variable "elasticache_node_type" {
  description = "ElastiCache node type."
  type        = string
  default     = "cache.r7g.large"
}

variable "elasticache_subnet_ids" {
  description = "Private subnets for ElastiCache (at least two zones)."
  type        = list(string)
  default     = []
}

variable "elasticache_security_group_ids" {
  description = "Security groups of ElastiCache; they should admit port 6379 from the EKS nodes only."
  type        = list(string)
  default     = []
}

variable "elasticache_auth_token" {
  description = "The Redis AUTH token (16-128 characters), e.g. from a secrets manager; required with elasticache_enabled."
  type        = string
  default     = null
  sensitive   = true
}

variable "tags" {
  description = "Tags added to every resource."
  type        = map(string)
  default     = {}
}
