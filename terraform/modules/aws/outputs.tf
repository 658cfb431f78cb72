output "table_name" {
  description = "The DynamoDB table: the chart's storage.dynamodb.table."
  value       = aws_dynamodb_table.cornus.name
}

output "table_arn" {
  description = "The table's ARN."
  value       = aws_dynamodb_table.cornus.arn
}

output "role_arn" {
  description = "The IRSA role: the chart's serviceAccount.annotations.\"eks.amazonaws.com/role-arn\"."
  value       = aws_iam_role.cornus.arn
}

output "policy_arn" {
  description = "The policy with the adapter's DynamoDB calls, to attach elsewhere too (e.g. EKS Pod Identity)."
  value       = aws_iam_policy.dynamodb.arn
}

output "redis_durability" {
  description = "storage.redis.durability for the ElastiCache group: its replica must have each write before the node answers it (the group replicates asynchronously and fsyncs nothing per write; docs/deploy.md, \"Durability\"); null without elasticache_enabled."
  value       = var.elasticache_enabled ? "replicas:${aws_elasticache_replication_group.cornus[0].num_cache_clusters - 1}" : null
}

output "redis_url" {
  description = "rediss:// URL of the ElastiCache primary, AUTH token included (for the Secret of storage.redis.existingSecret); null without elasticache_enabled."
  value       = var.elasticache_enabled ? "rediss://:${var.elasticache_auth_token}@${aws_elasticache_replication_group.cornus[0].primary_endpoint_address}:6379/0" : null
  sensitive   = true
}

output "helm_values" {
  description = "Chart values for the dynamodb backend with IRSA (pass storage.dynamodb.region yourself: the provider's region)."
  value = {
    storage = {
      backend = "dynamodb"
      dynamodb = {
        table = aws_dynamodb_table.cornus.name
      }
    }
    serviceAccount = {
      name = var.service_account_name
      annotations = {
        "eks.amazonaws.com/role-arn" = aws_iam_role.cornus.arn
      }
    }
    timeouts = {
      # Minutes: DynamoDB cannot refuse a write that arrives late (docs/deploy.md section 5).
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
